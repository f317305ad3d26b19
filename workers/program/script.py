"""Run an unmodified torchrun-style script or command as one rank: a child process with
the environment torchrun would give it, its output captured.

The child's environment is the rank environment (`workers.supervisor.environment`): allow-listed
names, the job's own `env` and torchrun's variables, never the service's secrets. A script
or command of a job with a shipped working directory runs in it (Ray made it the actor's
working directory); a script on the host runs in its own folder.

The script sets up its own process group (`init_process_group()` reads MASTER_ADDR and
MASTER_PORT from the environment), so the rank actor does not create one; as under
torchrun, the store it connects to is the launcher's (rank 0's actor holds it,
`workers.supervisor.actor.host_store`), not rank 0's script's. The output goes
line by line to the actor's stdout (Ray's worker log) and the last lines are kept, so a
failure carries them in its error. A stop request (cancel, preemption) sends SIGTERM, then
SIGKILL after `grace_s`.
"""

from __future__ import annotations

import collections
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from workers.program.context import RankContext
from workers.supervisor.environment import rank_environment

TAIL_LINES = 200


class ScriptFailed(RuntimeError):
    """The script or command exited non-zero; the message carries its last output."""


def torchrun_env(ctx: RankContext, master_addr: str, master_port: int) -> dict[str, str]:
    info = ctx.info
    return {
        "RANK": str(info.rank),
        "WORLD_SIZE": str(info.world_size),
        "LOCAL_RANK": str(info.local_rank),
        "LOCAL_WORLD_SIZE": str(info.local_world_size),
        "GROUP_RANK": "0",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def agent_store_env() -> dict[str, str]:
    """torchrun's word to `init_process_group` that the launcher hosts the store: every
    rank, rank 0 included, connects as a client."""
    return {
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


def command_line(entrypoint: dict[str, Any]) -> tuple[list[str], Path]:
    """argv and working directory of a script or command entrypoint."""
    if entrypoint["kind"] == "command":
        return list(entrypoint["argv"]), Path.cwd()
    path = Path(entrypoint["path"])
    cwd = Path.cwd() if entrypoint.get("shipped") else path.parent
    return [sys.executable, str(path), *entrypoint.get("args", [])], cwd


def child_environment(
    ctx: RankContext, entrypoint: dict[str, Any], master_addr: str, master_port: int
) -> dict[str, str]:
    env = {
        **rank_environment(os.environ, entrypoint.get("env") or {}),
        **torchrun_env(ctx, master_addr, master_port),
        **agent_store_env(),
        "PYTHONUNBUFFERED": "1",
    }
    if ctx.checkpoint_dir is not None:
        env["CHECKPOINT_DIR"] = str(ctx.checkpoint_dir)
    return env


def run_script(
    ctx: RankContext,
    entrypoint: dict[str, Any],
    *,
    master_addr: str,
    master_port: int,
    grace_s: float = 10.0,
) -> None:
    argv, cwd = command_line(entrypoint)
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=child_environment(ctx, entrypoint, master_addr, master_port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    reader = threading.Thread(target=_pump, args=(process, tail, ctx.rank), daemon=True)
    reader.start()
    while process.poll() is None:
        if ctx.should_stop():
            _terminate(process, grace_s)
            break
        try:
            process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
    reader.join(timeout=5)
    code = process.wait()
    ctx.report(step=0)
    if code != 0 and not ctx.should_stop():
        output = "".join(tail)
        what = shlex.join(argv[1:] if entrypoint["kind"] == "script" else argv)
        raise ScriptFailed(f"{what} exited with code {code}; its last output:\n{output}")


def _pump(process: subprocess.Popen[str], tail: collections.deque[str], rank: int) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        tail.append(line)
        print(f"[rank {rank}] {line}", end="", flush=True)


def _terminate(process: subprocess.Popen[str], grace_s: float) -> None:
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
