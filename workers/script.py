"""Run an unmodified torchrun-style script as one rank: a child Python process with the
environment torchrun would give it, its output captured.

The script sets up its own process group (`init_process_group()` reads MASTER_ADDR and
MASTER_PORT from the environment), so the rank actor does not create one. The output goes
line by line to the actor's stdout (Ray's worker log) and the last lines are kept, so a
failure carries them in its error. A stop request (cancel, preemption) sends SIGTERM, then
SIGKILL after `grace_s`.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from workers.context import RankContext

TAIL_LINES = 200


class ScriptFailed(RuntimeError):
    """The script exited non-zero; the message carries its last output."""


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


def run_script(
    ctx: RankContext,
    entrypoint: dict[str, Any],
    *,
    master_addr: str,
    master_port: int,
    grace_s: float = 10.0,
) -> None:
    path = Path(entrypoint["path"])
    env = {**os.environ, **torchrun_env(ctx, master_addr, master_port), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, str(path), *entrypoint.get("args", [])],
        cwd=path.parent,
        env=env,
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
        raise ScriptFailed(f"{path.name} exited with code {code}; its last output:\n{output}")


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
