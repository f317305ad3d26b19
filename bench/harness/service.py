"""Run `gangway serve` as a real subprocess, the way a user starts it."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gangway import Client, JobInfo, JobState

# Ray's worker processes take ports up to 19999 (its default max_worker_port).
_ABOVE_RAY_WORKERS = 20000


def free_port() -> int:
    """A port free now that nothing takes by chance before the caller binds it: below
    the ephemeral range, where bind(0) and every outgoing connection take theirs (CI saw
    a service restarted on its port find it taken), and above Ray's worker ports."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = range(_ABOVE_RAY_WORKERS, low)
    for port in random.sample(candidates, min(len(candidates), 200)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # no static port free: the system's choice
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Every e2e service gets a bootstrap admin key and its client sends it: a service given a
# database URL (SQLite file or PostgreSQL) has auth on, so those tests pass real key
# checks; only the embedded-default test (no URL) runs with auth off.
ADMIN_KEY = "e2e-bootstrap-admin-key"


class Service:
    """One `gangway serve` process; `restart()` starts a new one on the same settings."""

    def __init__(self, *, data_dir: Path, database_url: str = "", ray_address: str = "") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir / "serve.log"
        self.env = {
            **os.environ,
            "GANGWAY_DATA_DIR": str(data_dir),
            "GANGWAY_DATABASE_URL": database_url,
            "GANGWAY_RAY_ADDRESS": ray_address,
            "GANGWAY_PORT": str(self.port),
            "GANGWAY_SCHEDULE_INTERVAL_S": "0.5",
            # A service killed with -9 keeps the lease this long: short, so a restart
            # within a test takes over soon.
            "GANGWAY_LEASE_TTL_S": "3",
            "GANGWAY_ADMIN_KEY": ADMIN_KEY,
            # Benches and tests time and count their own jobs: no calibration runs
            # beside them unless asked for.
            "GANGWAY_AUTO_CALIBRATE": os.environ.get("GANGWAY_AUTO_CALIBRATE", "false"),
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120) -> Client:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gangway", "serve"], env=self.env, stdout=log, stderr=log
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"serve exited with {self.process.returncode}: {self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return Client(self.url, api_key=ADMIN_KEY)
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"serve did not come up in {timeout_s} s: {self.log_tail()}")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 60) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def wait_for(client: Client, job_id: int, predicate: str, timeout_s: float = 120) -> JobInfo:
    """Poll until `predicate` holds: a state name, or 'stepping' for RUNNING with step > 0."""
    deadline = time.monotonic() + timeout_s
    job = client.get(job_id)
    while time.monotonic() < deadline:
        job = client.get(job_id)
        if predicate == "stepping" and job.state is JobState.RUNNING and job.progress.step > 0:
            return job
        if job.state.value == predicate:
            return job
        if job.state.is_terminal:
            break
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} is {job.state} ({job.status_reason}), wanted {predicate}")
