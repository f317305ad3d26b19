"""The rank supervisor: the Ray actor the scheduler places, one per rank of a gang.

It is Gangway's own code and the only part of a rank that Gangway trusts. It never
imports the job's code; it prepares the rank's directories, starts the rank program
(`workers.program`) as a sandboxed child at once (so the program loads torch while the
gang assembles), hands it the rendezvous address on `start`, and relays what it says:
progress and events from the report channel, output lines from its pipe, its exit. Stop
notices, the stop deadline and teardown act on the program's whole process tree; the
program ends with the supervisor if Ray kills it.

`start()` returns at once and the runtime polls `status()`, so the state lives in this
(detached) actor, not in the service: a restarted service reattaches by name.
"""

from __future__ import annotations

import os
import queue
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from workers.channel import (
    REPORT_FD_ENV,
    STACKS_MESSAGE,
    STOP_MESSAGE,
    ErrorReport,
    EventReport,
    ProgressReport,
    ReadyReport,
    Report,
    StacksReport,
    StopSeenReport,
    go_message,
    metric_point,
)
from workers.checkpoint_store import JobCheckpointStore, RankOf
from workers.launch import (
    INSIDE_CHECKPOINTS,
    INSIDE_INPUTS,
    INSIDE_MODEL,
    INSIDE_OUTPUTS,
    INSIDE_RUN,
    INSIDE_TMP,
    INSIDE_WORK,
    BuiltinRun,
    CommandRun,
    FunctionRun,
    JobLaunch,
    ProgramLaunch,
    RankInfo,
    SandboxMode,
    ScriptRun,
)
from workers.stored_files import fetch_folder
from workers.supervisor import sandbox
from workers.supervisor.cgroups import RankGroup, rank_group
from workers.supervisor.checkpoint_sync import FINAL_TRIES_S, CheckpointSync
from workers.supervisor.environment import network_env, program_environment
from workers.supervisor.output import LineBuffer, Numbered
from workers.supervisor.outputs import Collected, OutputsUpload, collect, fetch_inputs
from workers.supervisor.process import ProgramProcess
from workers.supervisor.venvs import VenvBuild, job_venv
from workers.supervisor.workspace import (
    RankDirs,
    WorkspaceError,
    give_tree,
    input_mounts,
    node_directory,
    rank_dirs,
    shared_memory_dir,
    unpacked_package,
)

# Phases a rank reports; the group aggregates them.
IDLE, RUNNING, SUCCEEDED, FAILED = "idle", "running", "succeeded", "failed"
MAX_EVENTS = 50
MAX_POINTS = 10_000  # reported metric points kept until the runtime reads them
POINTS_PER_POLL = 2_000
TAIL_LINES = 30
STACKS_TIMEOUT_S = 4.0
PACKAGE_FETCH_TIMEOUT_S = 600.0  # a working directory of hundreds of MB over a slow link


@dataclass
class _Progress:
    """The latest report of the program, with what the supervisor derives from it."""

    latest: ProgressReport = field(default_factory=lambda: ProgressReport(step=0))
    first_loss: float | None = None
    reported_at: float = 0.0
    events: list[str] = field(default_factory=list)
    stop_seen: bool = False
    error_report: str | None = None
    error_at: float | None = None  # when the program said why it failed
    ready: bool = False  # loaded what it runs, waiting for the start signal


@dataclass
class _Started:
    """What the supervisor has set up for the program."""

    program: ProgramProcess
    dirs: RankDirs
    sandboxed: bool
    group: RankGroup | None


class RankSupervisor:
    def __init__(self, job: JobLaunch, info: RankInfo, package: list[Any] | None = None) -> None:
        """`package`: the shipped working directory's zip as a Ray object reference, in a
        list so that Ray hands over the reference, not the bytes: fetched only on a node
        that has not unpacked it yet."""
        import ray

        self._job, self._info = job, info
        self._package = package
        self._node_id = str(ray.get_runtime_context().get_node_id())
        self._node_ip = str(ray.util.get_node_ip_address())
        self._logs = LineBuffer()
        # Every progress report, numbered: the job's metrics, step by step (rank 0's are
        # stored). Bounded: a service that does not poll for long loses the oldest.
        self._points: Numbered[dict[str, Any]] = Numbered(maxlen=MAX_POINTS)
        self._lock = threading.Lock()
        self._progress = _Progress()
        self._stacks: queue.Queue[str] = queue.Queue()
        self._phase = IDLE
        self._error: str | None = None
        self._summary: str | None = None
        self._failed_at: float | None = None
        # When the stop notice came and when the program ended: the acknowledgement time
        # of a preemption or resize (the trainer saves before it exits).
        self._stop_at: float | None = None
        self._ended_at: float | None = None
        self._address: tuple[str, int] | None = None
        self._go = threading.Event()
        self._started: _Started | None = None
        self._loaded = threading.Event()  # the program said it is ready, or it ended
        self._collecting = threading.Lock()
        self._collected_step = -1
        self._store: Any = None  # rank 0 of a script gang: the process-group store
        self._sync: CheckpointSync | None = None  # checkpoints in a store, not a shared disk
        self._final_outputs = False  # the program ended; its outputs are being copied
        self._upload = (  # outputs in a store, not a shared disk
            OutputsUpload(f"{job.outputs_url}/rank-{info.rank}", job.outputs_max_bytes)
            if job.outputs_url is not None
            else None
        )
        threading.Thread(target=self._supervise, name="gangway-supervisor", daemon=True).start()

    # -- the runtime's calls ----------------------------------------------------------

    def rendezvous_address(self, store_world_size: int | None = None) -> tuple[str, int]:
        """This node's address and a free port: rank 0 hosts the process-group store. A
        script gang's store (`store_world_size`: its ranks) is this actor's, bound here
        on a port the system picks, so no other process can take it in between."""
        address = self._node_ip
        if store_world_size is not None:
            self._store = host_store(address, store_world_size)
            return address, int(self._store.port)
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return address, int(port)

    def start(self, *, master_addr: str, master_port: int) -> str:
        """Hand the program the rendezvous address; returns this rank's Ray node id once
        the program has loaded what it runs (or has failed), so a gang is RUNNING when its
        ranks are, not while they still import torch or install requirements."""
        if self._address is not None:
            raise RuntimeError("this rank was already started")
        self._address = (master_addr, master_port)
        with self._lock:
            if self._phase == IDLE:
                self._phase = RUNNING
        self._go.set()
        self._loaded.wait()
        return self._node_id

    def status(self, log_after: int = 0, points_after: int | None = None) -> dict[str, Any]:
        """Phase, progress, the output lines numbered above `log_after` and, when asked
        (`points_after`), the reported metric points numbered above it."""
        points = (
            self._points.since(points_after, POINTS_PER_POLL) if points_after is not None else []
        )
        with self._lock:
            progress = self._progress
            latest = progress.latest
            metrics = latest.metrics
            return {
                "logs": self._logs.since(log_after),
                "points": points,
                "phase": self._phase,
                "error": self._error,
                "summary": self._summary,
                "failed_at": self._failed_at,
                "step": latest.step,
                "loss": latest.loss,
                "first_loss": progress.first_loss,
                "tokens_per_s": latest.tokens_per_s,
                "checkpoint_step": _int_or_none(metrics.get("checkpoint_step")),
                "local_s": metrics.get("local_s"),
                "step_time_s": metrics.get("step_time_s"),
                "memory_mb": metrics.get("peak_memory_mb"),
                "comm_s": metrics.get("comm_s"),
                "comm_bytes": metrics.get("comm_bytes"),
                # while the last checkpoint uploads the rank is busy, not hung
                "reported_at": time.time() if self._uploading() else progress.reported_at,
                "stop_ack_s": self._stop_ack_s(),
                "stop_seen": progress.stop_seen,
                "events": tuple(progress.events),
                "pid": os.getpid(),
                "program_pid": self._started.program.pid if self._started else None,
                "program_ready": progress.ready,
            }

    def _uploading(self) -> bool:
        return self._final_outputs or (self._sync is not None and self._sync.finishing)

    def stop(self) -> None:
        """A stop notice (preemption, resize, cancel): the trainer or function is told and
        saves; a script or command gets SIGTERM, as under torchrun. Whatever still runs
        after the job's grace is killed, its whole tree."""
        with self._lock:
            if self._stop_at is not None:
                return
            self._stop_at = time.time()
            if isinstance(self._job.run, ScriptRun | CommandRun):
                self._progress.stop_seen = True
        if self._address is None:
            self._go.set()  # a rank stopped before it started never starts
        elif self._started is not None:
            self._notify_stop(self._started.program)
        timer = threading.Timer(self._job.stop_grace_s, self._kill_at_deadline)
        timer.daemon = True
        timer.start()

    def stacks(self) -> str:
        """The program's Python stacks, thread by thread, for a hang report."""
        if not isinstance(self._job.run, BuiltinRun | FunctionRun):
            return "(a script or command: its stacks are its own, not Gangway's)"
        started = self._started
        if started is None or started.program.poll() is not None:
            return "(the rank program is not running)"
        while not self._stacks.empty():
            self._stacks.get_nowait()
        started.program.send(STACKS_MESSAGE)
        try:
            return self._stacks.get(timeout=STACKS_TIMEOUT_S)
        except queue.Empty:
            return f"(the rank program did not answer in {STACKS_TIMEOUT_S:.0f} s)"

    # -- the supervising thread -------------------------------------------------------

    def _supervise(self) -> None:
        try:
            self._started = self._start_program()
        except Exception as exc:
            self._fail(f"could not be started: {exc}", "")
            self._loaded.set()
            return
        started = self._started
        self._go.wait()
        if self._stop_at is not None or self._address is None:
            started.program.kill()  # stopped before it started: nothing of the job ran
            with self._lock:
                self._progress.stop_seen = True
        else:
            started.program.send(go_message(*self._address))
        code = started.program.wait()
        self._loaded.set()
        self._final_outputs = True
        self._collect_outputs(final=True)
        self._final_outputs = False
        if self._sync is not None:
            self._logs.append("[gangway] uploading what the program saved last ...")
            self._sync.finish()  # before its folder goes; `status` says it is alive meanwhile
        out_of_memory = started.group is not None and started.group.out_of_memory()
        # Cleaned up before the phase says so: the runtime kills this actor once it does.
        shutil.rmtree(started.dirs.root, ignore_errors=True)
        if started.group is not None:
            started.group.remove()
        self._finish(code, started.sandboxed, out_of_memory)

    def _start_program(self) -> _Started:
        job, info = self._job, self._info
        support = sandbox.detect() if job.sandbox != SandboxMode.OFF else _UNSANDBOXED
        if job.sandbox == SandboxMode.REQUIRED and not support.sandboxed:
            raise RuntimeError(
                f"this node cannot sandbox the job ({support.detail}); the service requires "
                "a sandbox for every job (install bubblewrap on the node)"
            )
        identity = job.identity if support.kind == "bwrap-uid" else None
        base = node_directory() / self._node_id[:16]
        dirs = rank_dirs(base, job, info, identity)
        layout = _Layout(support.sandboxed, dirs)
        mounts = [
            sandbox.Mount(dirs.run, INSIDE_RUN),
            sandbox.Mount(dirs.tmp, INSIDE_TMP, writable=True),
            sandbox.Mount(dirs.outputs, INSIDE_OUTPUTS, writable=True),
            sandbox.Mount(shared_memory_dir(base, job, identity), "/dev/shm", writable=True),
        ]
        work = self._working_directory(base)
        if work is not None:
            mounts.append(sandbox.Mount(work, INSIDE_WORK))
            layout.work = work
        checkpoints = self._checkpoint_directory(dirs)
        if checkpoints is not None:
            if identity is not None:
                give_tree(checkpoints, identity)
            else:
                checkpoints.mkdir(parents=True, exist_ok=True)
            mounts.append(sandbox.Mount(checkpoints, INSIDE_CHECKPOINTS, writable=True))
            layout.checkpoints = checkpoints
        model = self._model_directory(dirs)
        if model is not None:
            mounts.append(sandbox.Mount(model, INSIDE_MODEL))
            layout.model = model
        inputs = self._input_directories(dirs)
        if inputs:
            layout.inputs = dirs.root / "inputs"
            mounts += input_mounts(layout.inputs, inputs, support.sandboxed)
        mounts += [sandbox.Mount(Path(p), p) for p in self._host_paths() if Path(p).exists()]
        python = sys.executable
        trusted_env = _trusted_environment(layout)
        if job.requirements:
            build = VenvBuild(
                job.user,
                tuple(job.requirements),
                support,
                identity,
                work,
                dirs.root,
                dict(trusted_env),
                self._logs,
            )
            venv = job_venv(base, build)
            mounts.append(sandbox.Mount(venv, str(venv)))
            python = str(venv / "bin" / "python")
            trusted_env["PATH"] = f"{venv}/bin:{trusted_env['PATH']}"
            trusted_env["VIRTUAL_ENV"] = str(venv)

        group = rank_group(
            dirs.root.name, pids_max=job.limits.processes, memory_bytes=job.limits.memory_bytes
        )
        # What the group bounds for the rank alone, the program need not bound per uid.
        limits = job.limits.model_copy(update={"processes": None, "memory_bytes": None})

        def write_launch(report_fd: int) -> None:
            launch = self._program_launch(layout, trusted_env, report_fd)
            launch = launch.model_copy(update={"limits": limits if group else job.limits})
            (dirs.run / "launch.json").write_text(launch.model_dump_json())

        program = ProgramProcess(
            [python, "-I", "-m", "workers.program", layout.run_file],
            support=support,
            mounts=mounts,
            cwd=layout.cwd(self._job.run),
            identity=identity or job.identity,
            env=trusted_env,
            logs=self._logs,
            on_report=self._on_report,
            report_fd_env=write_launch,
            group=group,
        )
        return _Started(program, dirs, support.sandboxed, group)

    def _checkpoint_directory(self, dirs: RankDirs) -> Path | None:
        """The job's shared checkpoint directory, or (checkpoints in a store) this rank's
        own on this host, the newest complete checkpoint fetched into it first."""
        job, info = self._job, self._info
        if job.checkpoint_url is None:
            return Path(job.checkpoint_dir) if job.checkpoint_dir is not None else None
        rank = RankOf(job.attempt, info.rank, info.world_size)
        local = dirs.root / "checkpoints"
        self._sync = CheckpointSync(
            JobCheckpointStore(job.checkpoint_url), local, rank, job.keep_last, self._logs.append
        )
        try:
            self._sync.restore()
        except Exception as exc:
            raise RuntimeError(
                f"the job's checkpoints could not be read from its store: {exc}"
            ) from exc
        self._sync.start()
        return local

    def _input_directories(self, dirs: RankDirs) -> dict[str, str]:
        """The outputs of the jobs this one reads (`inputs_from`) by name: folders of
        the shared storage, or fetched from the store onto this host first."""
        job = self._job
        if not job.input_urls:
            return dict(job.input_dirs)
        try:
            return fetch_inputs(job.input_urls, dirs.root / "inputs-fetched", self._logs.append)
        except Exception as exc:
            raise RuntimeError(
                f"the outputs this job reads (inputs_from) could not be fetched: {exc}"
            ) from exc

    def _model_directory(self, dirs: RankDirs) -> Path | None:
        """The weights the job starts from (`init_from`), read-only: a folder of the
        storage dir, or a job's checkpoint or a model version fetched from the store
        onto this host."""
        job = self._job
        missing = (
            "the weights this job starts from (init_from) are not there: a model version "
            "deleted since the job was submitted, or a job's checkpoint that was never "
            "completed or is deleted"
        )
        if job.model_checkpoints is not None:
            upstream = JobCheckpointStore(job.model_checkpoints)
            saved = {c.step: c for c in upstream.listing()}
            step = job.model_step if job.model_step is not None else max(saved, default=None)
            if step not in saved:
                raise RuntimeError(f"{missing} ({upstream.url} has no complete one there)")
            return upstream.download(saved[step], dirs.root / "model")
        if job.model_url is not None:
            try:
                unplaced = fetch_folder(job.model_url, dirs.root / "model")
            except Exception as exc:
                raise RuntimeError(f"the model version could not be fetched: {exc}") from exc
            if unplaced or not any((dirs.root / "model").iterdir()):
                raise RuntimeError(f"{missing} ({job.model_url} holds no usable files)")
            return dirs.root / "model"
        if job.model_dir is None:
            return None
        if not Path(job.model_dir).is_dir():
            raise RuntimeError(missing)
        return Path(job.model_dir)

    def _working_directory(self, base: Path) -> Path | None:
        """The shipped working directory, unpacked on this node; the built-in trainer
        never gets one (it loads no shipped code)."""
        package = self._job.package
        if package is None or isinstance(self._job.run, BuiltinRun):
            return None
        folder = unpacked_package(base, package.sha256, self._fetch_package, self._job.limits)
        self._package = None  # unpacked: the service's copy need not stay pinned for us
        return folder

    def _fetch_package(self) -> bytes:
        """The zip's bytes from Ray's object store (from the service, wherever it runs)."""
        import ray

        if not self._package:
            raise WorkspaceError("the working directory's package was not shipped with the launch")
        try:
            data = ray.get(self._package[0], timeout=PACKAGE_FETCH_TIMEOUT_S)
        except ray.exceptions.RayError as exc:
            raise WorkspaceError(
                f"the working directory's package could not be fetched: {exc}"
            ) from exc
        if not isinstance(data, bytes):
            raise WorkspaceError("the working directory's package is not a zip's bytes")
        return data

    def _host_paths(self) -> list[str]:
        """Host files the job may read: its data file, and the folder of a script that
        lives on the host (policy allowed it at submit)."""
        paths = list(self._job.host_paths)
        run = self._job.run
        if isinstance(run, ScriptRun) and self._job.package is None:
            paths.append(str(Path(run.path).resolve().parent))
        return paths

    def _program_launch(
        self, layout: _Layout, trusted_env: dict[str, str], report_fd: int
    ) -> ProgramLaunch:
        job, info = self._job, self._info
        rank_env = {
            "RANK": str(info.rank),
            "WORLD_SIZE": str(info.world_size),
            "LOCAL_RANK": str(info.local_rank),
            "LOCAL_WORLD_SIZE": str(info.local_world_size),
            "GROUP_RANK": "0",
            "OUTPUTS_DIR": layout.outputs_path,
            REPORT_FD_ENV: str(report_fd),
        }
        if layout.checkpoints is not None:
            rank_env["CHECKPOINT_DIR"] = layout.checkpoint_path
        if layout.model_path is not None:
            rank_env["MODEL_DIR"] = layout.model_path
        if layout.inputs is not None:
            rank_env["INPUTS_DIR"] = layout.inputs_path
        if isinstance(job.run, ScriptRun | CommandRun):
            rank_env.update(agent_store_env())
        if job.faults:
            rank_env["GANGWAY_FAULTS"] = job.faults
        trusted_env = {**network_env(self._node_ip, os.environ), **trusted_env}
        env = program_environment(os.environ, sandbox=trusted_env, job=job.env, rank=rank_env)
        run = job.run
        if isinstance(run, ScriptRun) and job.package is None:
            run = run.model_copy(update={"path": str(Path(run.path).resolve())})
        return ProgramLaunch(
            info=info,
            run=run,
            work_dir=layout.work_path,
            checkpoint_dir=layout.checkpoint_path if layout.checkpoints is not None else None,
            own_checkpoint_dir=job.checkpoint_url is not None,
            outputs_dir=layout.outputs_path,
            model_dir=layout.model_path,
            keep_last=job.keep_last,
            env=env,
            limits=job.limits,
        )

    # -- what the program says --------------------------------------------------------

    def _on_report(self, report: Report) -> None:
        checkpoint_step = None
        with self._lock:
            progress = self._progress
            if isinstance(report, ProgressReport):
                progress.latest = report
                progress.reported_at = time.time()
                self._points.append(metric_point(report, progress.reported_at))
                if progress.first_loss is None:
                    progress.first_loss = report.loss
                checkpoint_step = report.metrics.get("checkpoint_step")
            elif isinstance(report, EventReport) and len(progress.events) < MAX_EVENTS:
                progress.events.append(report.text)
            elif isinstance(report, StopSeenReport):
                progress.stop_seen = True
            elif isinstance(report, ReadyReport):
                progress.ready = True
                self._loaded.set()
            elif isinstance(report, ErrorReport):
                progress.error_report = report.text
                progress.error_at = time.time()
        if isinstance(report, StacksReport):
            self._stacks.put(report.text)
        if checkpoint_step is not None and checkpoint_step > self._collected_step:
            self._collected_step = int(checkpoint_step)
            threading.Thread(target=self._collect_outputs, daemon=True).start()
            if self._sync is not None:
                self._sync.notify(int(checkpoint_step))

    def _collect_outputs(self, final: bool = False) -> None:
        """Copy the rank's outputs into the service's storage: at every checkpoint (one
        collection at a time; a busy one is skipped) and, waiting its turn, at the end."""
        job, started = self._job, self._started
        if (job.outputs_dir is None and self._upload is None) or started is None:
            return
        if not self._collecting.acquire(blocking=final):
            return
        try:
            done = self._copy_outputs(started.dirs.outputs, tries=FINAL_TRIES_S if final else (0,))
        except Exception as exc:  # the disk, or the store and the network
            self._logs.append(f"[gangway] outputs could not be collected: {exc}")
            return
        finally:
            self._collecting.release()
        if final and (done.files or done.over_quota or done.skipped):
            self._logs.append(f"[gangway] {done.summary()}")

    def _copy_outputs(self, source: Path, tries: tuple[float, ...]) -> Collected:
        """One collection into the shared folder, or uploads to the store tried after
        each wait in `tries` (what went up stays up: a retry sends the rest)."""
        job = self._job
        if self._upload is None:
            target = Path(str(job.outputs_dir)) / f"rank-{self._info.rank}"
            return collect(source, target, max_bytes=job.outputs_max_bytes)
        for wait_s in tries[:-1]:
            time.sleep(wait_s)
            try:
                return self._upload.collect(source)
            except Exception as exc:  # the store or the network: tried again
                self._logs.append(f"[gangway] outputs upload failed ({exc}); trying again")
        time.sleep(tries[-1])
        return self._upload.collect(source)

    # -- ending -----------------------------------------------------------------------

    def _notify_stop(self, program: ProgramProcess) -> None:
        if isinstance(self._job.run, ScriptRun | CommandRun):
            program.terminate()
        else:
            program.send(STOP_MESSAGE)

    def _kill_at_deadline(self) -> None:
        started = self._started
        if started is not None and started.program.poll() is None:
            self._logs.append(
                f"[gangway] still running {self._job.stop_grace_s:.0f} s after the stop "
                "notice: killed"
            )
            started.program.kill()

    def _finish(self, code: int, sandboxed: bool, out_of_memory: bool) -> None:
        with self._lock:
            self._ended_at = time.time()
            stopped = self._stop_at is not None
        if code == 0 or stopped:
            with self._lock:
                self._phase = SUCCEEDED
            return
        headline = f"{self._subject()} {describe_exit(code, sandboxed)}"
        if out_of_memory:
            headline += f": out of memory (its limit is {self._job.limits.memory_bytes} bytes)"
        with self._lock:
            error_report = self._progress.error_report
        if error_report:
            self._fail(headline, error_report)
        else:
            tail = "\n".join(self._logs.tail(TAIL_LINES))
            self._fail(headline + exit_race_hint(code, sandboxed, tail), tail, output=True)

    def _fail(self, headline: str, detail: str, *, output: bool = False) -> None:
        last = next((line.strip() for line in reversed(detail.splitlines()) if line.strip()), "")
        with self._lock:
            self._ended_at = self._ended_at or time.time()
            self._failed_at = self._progress.error_at or self._ended_at
            if output and detail:
                self._error = f"{headline}; its last output:\n{detail}"
            else:
                self._error = f"{headline}\n{detail}" if detail else headline
            self._summary = f"{headline}: {last}"[:500] if last else headline[:500]
            self._phase = FAILED

    def _subject(self) -> str:
        run = self._job.run
        if isinstance(run, ScriptRun):
            return shlex.join([run.path, *run.args])[:200]
        if isinstance(run, CommandRun):
            return shlex.join(run.argv)[:200]
        if isinstance(run, FunctionRun):
            return run.target
        return "the built-in trainer"

    def _stop_ack_s(self) -> float | None:
        if self._stop_at is None or self._ended_at is None:
            return None
        return max(0.0, self._ended_at - self._stop_at)


_UNSANDBOXED = sandbox.Support("none", "the job's sandbox is turned off")


class _Layout:
    """Where the rank's folders are as the program sees them: inside the sandbox at
    fixed paths, or (unsandboxed) at their paths on the host."""

    def __init__(self, sandboxed: bool, dirs: RankDirs) -> None:
        self.sandboxed, self.dirs = sandboxed, dirs
        self.work: Path | None = None
        self.checkpoints: Path | None = None
        self.model: Path | None = None
        self.inputs: Path | None = None

    def _place(self, inside: str, host: Path) -> str:
        return inside if self.sandboxed else str(host)

    @property
    def run_file(self) -> str:
        return f"{self._place(INSIDE_RUN, self.dirs.run)}/launch.json"

    @property
    def tmp_path(self) -> str:
        return self._place(INSIDE_TMP, self.dirs.tmp)

    @property
    def outputs_path(self) -> str:
        return self._place(INSIDE_OUTPUTS, self.dirs.outputs)

    @property
    def checkpoint_path(self) -> str:
        assert self.checkpoints is not None
        return self._place(INSIDE_CHECKPOINTS, self.checkpoints)

    @property
    def model_path(self) -> str | None:
        return self._place(INSIDE_MODEL, self.model) if self.model is not None else None

    @property
    def inputs_path(self) -> str:
        assert self.inputs is not None
        return self._place(INSIDE_INPUTS, self.inputs)

    @property
    def work_path(self) -> str | None:
        return self._place(INSIDE_WORK, self.work) if self.work is not None else None

    def cwd(self, run: Any) -> str:
        """Where the program starts: the working directory, a host script's folder, or
        its tmp."""
        if self.work_path is not None:
            return self.work_path
        if isinstance(run, ScriptRun):
            return str(Path(run.path).resolve().parent)
        return self.tmp_path


def _trusted_environment(layout: _Layout) -> dict[str, str]:
    """What the sandbox's own tools and the interpreter start with: Gangway's values
    only (the job's come from the launch file, after the drop)."""
    venv = Path(sys.prefix)
    return {
        "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": layout.tmp_path,
        "TMPDIR": layout.tmp_path,
        "VIRTUAL_ENV": str(venv),
        "PYTHONUNBUFFERED": "1",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }


def describe_exit(code: int, sandboxed: bool) -> str:
    """How a program ended, in words. A sandboxed program killed by signal N is reported
    by bubblewrap as exit code 128 + N."""
    if code < 0:
        return f"was killed by {_signal_name(-code)}"
    if sandboxed and 128 < code < 128 + 65:
        return f"was killed by {_signal_name(code - 128)} (exit code {code})"
    return f"exited with code {code}"


GLOO_EXIT_RACE = "terminate called without an active exception"


def exit_race_hint(code: int, sandboxed: bool, tail: str) -> str:
    """What to do about a program aborted by C++'s `std::terminate` as it exits: on gloo,
    torch 2.13 does so in about one exit in five when a worker thread drops the last
    reference to a collective (DDP's last allreduce) while the interpreter is shutting
    down (pytorch/pytorch#179291); '' for any other ending."""
    aborted = code == -signal.SIGABRT or (sandboxed and code == 128 + signal.SIGABRT)
    if not aborted or GLOO_EXIT_RACE not in tail:
        return ""
    return (
        " (at exit: often torch's gloo teardown race; free the models that hold the"
        " process group (del, gc.collect()) before destroy_process_group)"
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _int_or_none(value: float | None) -> int | None:
    return int(value) if value is not None else None


def agent_store_env() -> dict[str, str]:
    """torchrun's word to `init_process_group` that the launcher hosts the store: every
    rank, rank 0 included, connects as a client."""
    return {
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


def host_store(address: str, world_size: int, timeout_s: float = 600.0) -> Any:
    """The process-group store of a script gang, held by rank 0's supervisor as
    torchrun's agent holds it (on a free port, `.port`): the scripts connect as clients
    (TORCHELASTIC_USE_AGENT_STORE), so the store outlives every script, and a rank that
    tears down its process group after rank 0's script has exited still finds it."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    return TCPStore(
        address,
        0,
        world_size,
        is_master=True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
