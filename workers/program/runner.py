"""The rank program's entry point: `python -m workers.program LAUNCH_JSON`.

It runs inside the sandbox the supervisor built, as an unprivileged identity, and trusts
nothing it has not been handed: the launch file (what to run, where its directories are),
its environment, the report channel and its stdin. In order:

1. read the launch and load what the entrypoint needs (the built-in trainer imports the
   engine now, while the rest of the gang assembles);
2. say it is ready, then wait on stdin for the start signal with the rendezvous address;
3. scripts and commands: become the user's program (exec), torchrun-style, with stdin
   closed; the built-in trainer and functions: join the process group and run, turning a
   failure into its traceback on stderr and on the report channel, and exit 1.

Stop notices and stack requests keep arriving on stdin while a trainer or function runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

from workers.channel import ErrorReport, ReadyReport, ReportSender, StacksReport
from workers.launch import (
    BuiltinRun,
    CommandRun,
    FunctionRun,
    ProgramLaunch,
    RankLimits,
    ScriptRun,
)
from workers.program.context import RankContext

_PR_SET_PDEATHSIG = 1


class Control:
    """Reads the supervisor's messages from stdin on a thread: the start signal, stop
    notices and stack requests. A closed stdin means the supervisor is gone: stop."""

    def __init__(self, sink: ReportSender | None) -> None:
        self.stop = threading.Event()
        self._go = threading.Event()
        self._address: tuple[str, int] | None = None
        self._sink = sink
        threading.Thread(target=self._read, name="gangway-control", daemon=True).start()

    def wait_for_go(self) -> tuple[str, int]:
        self._go.wait()
        if self._address is None:
            raise SystemExit("the supervisor went away before the start signal")
        return self._address

    def _read(self) -> None:
        for line in _lines(0):
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if "go" in message:
                go = message["go"]
                self._address = (str(go["master_addr"]), int(go["master_port"]))
                self._go.set()
            elif message.get("stop"):
                self.stop.set()
            elif message.get("stacks") and self._sink is not None:
                self._sink.send(StacksReport(text=all_stacks()[-50_000:]))
        self.stop.set()
        self._go.set()


def _lines(fd: int) -> Iterator[bytes]:
    """The lines arriving on `fd`, read with plain `os.read`: a thread blocked in the
    buffered `sys.stdin` would hold its lock when the interpreter exits, and abort it."""
    pending = b""
    while chunk := os.read(fd, 4096):
        *complete, pending = (pending + chunk).split(b"\n")
        yield from complete


def all_stacks() -> str:
    """Every thread's Python stack in this process, for a hang report."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"thread {names.get(ident, ident)}:\n{stack}")
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    _die_with_parent()
    launch = ProgramLaunch.model_validate_json(Path(argv[1]).read_text())
    apply_limits(launch.limits)
    os.environ.clear()
    os.environ.update(launch.env)
    sink = ReportSender.from_environment()
    control = Control(sink)
    _preload(launch)
    if sink is not None:
        sink.send(ReadyReport())
    master_addr, master_port = control.wait_for_go()
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
    run = launch.run
    if isinstance(run, ScriptRun | CommandRun):
        _become(_argv(run))
    ctx = RankContext(
        launch.info,
        control.stop,
        checkpoint_dir=Path(launch.checkpoint_dir) if launch.checkpoint_dir else None,
        own_checkpoint_dir=launch.own_checkpoint_dir,
        keep_last=launch.keep_last,
        outputs_dir=Path(launch.outputs_dir),
        model_dir=Path(launch.model_dir) if launch.model_dir else None,
        sink=sink,
    )
    with process_group(ctx, f"tcp://{master_addr}:{master_port}"):
        try:
            _run_entrypoint(ctx, run, launch.work_dir)
        except BaseException:
            # Said before the process group is torn down: that waits on the peers, and
            # the first rank to fail is the one the job's reason names.
            text = traceback.format_exc(limit=20)
            print(text, file=sys.stderr, end="", flush=True)
            if sink is not None:
                sink.send(ErrorReport(text=text[-50_000:]))
            return 1
    return 0


def apply_limits(limits: RankLimits) -> None:
    """Lower this process's resource limits, soft and hard, before any of the job's code
    runs: what it starts inherits them and cannot raise them again. No core dumps (they
    would write the process's memory where the job can read it back)."""
    wanted = {
        resource.RLIMIT_NOFILE: limits.open_files,
        resource.RLIMIT_NPROC: limits.processes,
        resource.RLIMIT_FSIZE: limits.file_bytes,
        resource.RLIMIT_AS: limits.memory_bytes,
        resource.RLIMIT_CORE: 0,
    }
    for which, value in wanted.items():
        if value is None:
            continue
        _soft, hard = resource.getrlimit(which)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (cap, cap))


def _die_with_parent() -> None:
    """End with whoever started this process (bubblewrap's init, or the supervisor when
    there is no sandbox), so no rank outlives its supervisor."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _preload(launch: ProgramLaunch) -> None:
    """Import what the entrypoint needs while the gang is still assembling: the first
    DDP(...) imports torch._dynamo lazily (~4 s), which would otherwise stall step 1."""
    if isinstance(launch.run, BuiltinRun):
        import torch._dynamo
        import torch.distributed

        import workers.engine.training  # noqa: F401  (FSDP, TP, pipelining, DCP)
    elif isinstance(launch.run, FunctionRun):
        import torch.distributed  # noqa: F401


def _argv(run: ScriptRun | CommandRun) -> list[str]:
    if isinstance(run, CommandRun):
        return list(run.argv)
    return [sys.executable, run.path, *run.args]


def _become(argv: list[str]) -> NoReturn:
    """Replace this process with the user's script or command, its stdin empty (the
    control channel is ours), its output this process's (the supervisor's pipe)."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        raise SystemExit(127) from exc


@contextlib.contextmanager
def process_group(ctx: RankContext, init_method: str) -> Iterator[None]:
    """The job's process group for the block (gloo on CPUs, NCCL on GPUs)."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=timedelta(seconds=600),
    )
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run_entrypoint(ctx: RankContext, run: BuiltinRun | FunctionRun, work_dir: str | None) -> None:
    if isinstance(run, BuiltinRun):
        from workers.program.trainer import train_builtin

        train_builtin(ctx, run.fields)
        return
    from workers.program.entrypoints import resolve_function

    if work_dir is not None:
        sys.path.insert(0, work_dir)
    resolve_function(run.target)(ctx, **run.kwargs)
