"""One attack as a hostile plain user runs it, on whatever deployment a test gives: alice
runs a long job with a secret in its environment and files in its checkpoint and outputs
directories; bob ships `attacker/attack.py` and runs it as a command job while alice's
job runs. The report comes back through the public API: bob downloads it from his job's
outputs.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gangway import Builtin, Client, Command, JobState

ATTACKER = Path(__file__).parent / "attacker"
ALICE_SECRET = "alice-wandb-key-0b5e3f"


@dataclass(frozen=True)
class Target:
    """What the attacker is assumed to know or guess about the deployment."""

    data_dir: Path
    ray_dir: Path
    gcs_address: str
    secrets: tuple[str, ...]


@dataclass(frozen=True)
class Outcome:
    report: dict[str, Any]
    attacker: Client
    attack_job: int
    victim_job: int
    alice_state_after: JobState
    alice_attempt_after: int
    builtin_state: JobState  # bob's builtin job shipped with a sitecustomize.py
    builtin_logs: str


def users(admin: Client, url: str) -> tuple[Client, Client]:
    clients = []
    for name in ("alice", "bob"):
        admin.create_user(name)
        clients.append(Client(url, api_key=admin.issue_key(name).secret))
    return clients[0], clients[1]


def alice_job(alice: Client, scratch: Path) -> int:
    """A job that leaves secrets where bob would look: its environment, its checkpoint
    directory, its outputs; then waits long enough to be attacked."""
    work = scratch / "alice"
    work.mkdir()
    (work / "run.sh").write_text(
        'echo "ALICE-CHECKPOINT" > "$CHECKPOINT_DIR/secret.txt"\n'
        'echo "ALICE-OUTPUT" > "$OUTPUTS_DIR/secret.txt"\n'
        "sleep 300\n"
    )
    job = alice.submit(
        name="alice-long",
        entrypoint=Command(argv=["sh", "run.sh"]),
        working_dir=work,
        env={"WANDB_API_KEY": ALICE_SECRET},
    )
    wait_state(alice, job.id, JobState.RUNNING)
    return job.id


def builtin_with_sitecustomize(bob: Client, scratch: Path) -> int:
    """A builtin job whose shipped directory holds a sitecustomize.py: Python imports one
    at start from its path, which once made every rank run it."""
    work = scratch / "site"
    work.mkdir()
    (work / "sitecustomize.py").write_text("print('SITECUSTOMIZE-RAN', flush=True)\n")
    job = bob.submit(
        name="builtin-site", entrypoint=Builtin(steps=2, batch_size=2), working_dir=work
    )
    return job.id


def attack(admin: Client, url: str, target: Target, scratch: Path) -> Outcome:
    alice, bob = users(admin, url)
    victim_job = alice_job(alice, scratch)
    builtin_job = builtin_with_sitecustomize(bob, scratch)
    time.sleep(2)  # alice's script has written its files
    work = scratch / "bob"
    shutil.copytree(ATTACKER, work)
    data = target.data_dir
    config = {
        "secrets": [*target.secrets, ALICE_SECRET],
        "read": [
            str(data / "gangway.db"),
            str(target.ray_dir / "auth_token"),
            str(Path.home() / ".ray" / "auth_token"),
            str(data / "checkpoints" / f"job-{victim_job}" / "secret.txt"),
            str(data / "outputs" / f"job-{victim_job}" / "rank-0" / "secret.txt"),
            "/etc/shadow",
        ],
        "write": [
            "/gangway/work/planted.txt",
            "/usr/planted.txt",
            "/etc/passwd",
            str(data / "planted.txt"),
            str(data / "checkpoints" / f"job-{victim_job}" / "planted.txt"),
            "/tmp/mine.txt",
            "/gangway/outputs/mine.txt",
        ],
        "database": str(data / "gangway.db"),
        "gcs_address": target.gcs_address,
        "victim_actor": f"gangway-job{victim_job}-attempt1-rank0",
    }
    (work / "config.json").write_text(json.dumps(config))  # not argv: bob's own cmdline
    job = bob.submit(
        name="attack",
        entrypoint=Command(argv=["python", "attack.py", "config.json"]),
        working_dir=work,
    )
    done = bob.wait(job.id, timeout_s=300, poll_s=0.5)
    assert done.state is JobState.SUCCEEDED, done.error
    (written,) = bob.download(job.id, "report.json", scratch / "report")
    after = alice.get(victim_job)
    alice.cancel(victim_job)
    builtin = bob.wait(builtin_job, timeout_s=300, poll_s=0.5)
    return Outcome(
        builtin_state=builtin.state,
        builtin_logs="\n".join(line.line for line in bob.logs(builtin_job, tail=2000)),
        report=json.loads(written.read_text()),
        attacker=bob,
        attack_job=job.id,
        victim_job=victim_job,
        alice_state_after=after.state,
        alice_attempt_after=after.attempt,
    )


def wait_state(client: Client, job_id: int, state: JobState, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while (job := client.get(job_id)).state is not state:
        assert not job.state.is_terminal and time.monotonic() < deadline, job.status_reason
        time.sleep(0.5)
