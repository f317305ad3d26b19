"""`gangway serve`: migrate the database, join or start Ray, run the loop, serve HTTP."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import astuple, replace
from typing import Any

import uvicorn
from fastapi import FastAPI

from api.app import create_app
from api.auth import AuthConfig
from api.browser import LOOPBACK_HOSTS, allowed_hosts
from api.policy import policy_from_settings
from api.settings import Settings
from scheduler.runtime.cluster import RayClusterSource
from scheduler.runtime.executor import RayExecutor
from scheduler.runtime.launch import LaunchPolicy
from scheduler.runtime.lease import LeaderLease
from scheduler.runtime.local_ray import (
    LocalClusterShape,
    ray_directory,
    start_local_cluster,
    start_watchdog,
)
from scheduler.runtime.loop import SchedulerLoop
from scheduler.runtime.stragglers import StragglerWatch
from scheduler.store import JobRepository, QueueRepository, make_engine, upgrade_to_head
from scheduler.store.artifact_retention import ArtifactSweeper, sweep_artifacts
from scheduler.store.base import utcnow
from scheduler.store.model_retention import ModelVersionSweeper
from scheduler.store.output_usage import storage_usage
from scheduler.store.packages import PackageStore
from scheduler.store.registry import ModelRegistry
from scheduler.store.retention import TelemetrySweeper
from workers.launch import SandboxMode
from workers.supervisor import sandbox

log = logging.getLogger("gangway")


class Runtime:
    """Ray connection + scheduler loop thread, started and stopped with the HTTP server."""

    def __init__(self, settings: Settings, repo: JobRepository) -> None:
        self._settings = settings
        self._repo = repo
        self._stop = threading.Event()
        self.wake = threading.Event()  # set by the API when a job arrives or is cancelled
        self._thread: threading.Thread | None = None
        self._local_cluster: Any = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._lease = LeaderLease(repo, ttl_s=settings.lease_ttl_s)
        self.failed: BaseException | None = None  # why the service must stop and restart
        # How the whole service is stopped (`serve` sets it: its HTTP server's exit flag);
        # without one (an app run some other way), SIGTERM to this process.
        self.stop_service: Callable[[], None] | None = None

    def start(self) -> None:
        with _keep_signal_handlers():
            self._connect_ray()
        loop = SchedulerLoop(
            repo=self._repo,
            cluster=RayClusterSource(),
            executor=RayExecutor(
                placement_timeout_s=self._settings.placement_timeout_s,
                policy=self._launch_policy(),
                call_timeout_s=self._lease.action_bound_s,
                trouble_grace_s=self._settings.ray_trouble_grace_s,
            ),
            policy=self._settings.policy(),
            queues=QueueRepository(self._repo.engine).quotas,
            fair_share_half_life_s=self._settings.fair_share_half_life_s,
            lifecycle=self._settings.lifecycle(),
            stragglers=StragglerWatch(
                factor=self._settings.straggler_factor, window=self._settings.straggler_window
            ),
            lease=self._lease,
            sweep_every=self._settings.sweep_every_passes,
            auto_calibrate=self._settings.calibrates(),
        )
        self._thread = threading.Thread(
            target=loop.run,
            args=(self._stop, self._settings.schedule_interval_s),
            kwargs={
                "busy_interval_s": self._settings.busy_interval_s,
                "wake": self.wake,
                "fatal": self._fail,
            },
            name="gangway-scheduler",
            daemon=True,
        )
        self._thread.start()
        threading.Thread(
            target=self._collect_packages, name="gangway-package-gc", daemon=True
        ).start()
        log.info("scheduler loop running")
        sweeper = TelemetrySweeper(self._repo.engine, self._settings.retention(), utcnow)
        threading.Thread(
            target=_sweep_telemetry,
            args=(sweeper, self._stop, self._settings.retention_interval_s),
            name="gangway-retention",
            daemon=True,
        ).start()
        retention = self._settings.artifact_retention()
        artifacts = ArtifactSweeper(self._repo, retention, utcnow)
        versions = ModelVersionSweeper(
            ModelRegistry(self._repo.engine),
            self._settings.models_root(),
            self._repo,
            retention.age,
            utcnow,
            store=self._settings.model_store(),
        )
        threading.Thread(
            target=sweep_artifacts,
            args=((artifacts, versions), self._stop, self._settings.retention_interval_s),
            name="gangway-artifact-retention",
            daemon=True,
        ).start()

    def _fail(self, reason: BaseException) -> None:
        """End the whole service (the HTTP server too, so clients and the process's
        manager see it go), saying why; `serve` then exits non-zero, to be restarted."""
        self.failed = reason
        if self.stop_service is not None:
            self.stop_service()
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    def _launch_policy(self) -> LaunchPolicy:
        """The settings' launch policy, with each launch capped to what its user may
        still add to their storage (outputs and model versions share one quota)."""
        settings, repo = self._settings, self._repo
        models, outputs = ModelRegistry(repo.engine), settings.outputs_storage()

        def outputs_left(user: str) -> int:
            """Never waits on a store: a job's outputs not counted yet count as none
            while they are listed in the background (`RemoteOutputs.job_bytes`)."""
            quota, now = settings.storage_quota_bytes, repo.now()
            usage = storage_usage(
                repo, models, outputs, user, quota_bytes=quota, now=now, wait=False
            )
            return usage.remaining_bytes

        return replace(settings.launch_policy(), outputs_left=outputs_left)

    def _collect_packages(self) -> None:
        """Delete uploaded working directories no unfinished job needs, now and then."""
        store = PackageStore(self._repo.engine, self._settings.packages_root())
        grace_s = self._settings.package_grace_s
        while not self._stop.wait(min(grace_s / 4, 600.0)):
            removed = store.collect(grace_s=grace_s)
            if removed:
                log.info("deleted %d unused packages", len(removed))

    def stop(self) -> None:
        """Stop scheduling. Ranks keep running on an external Ray (they are reattached on
        the next start); a local Ray ends with the service."""
        import ray

        self._stop.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.failed is None:  # a lost node's raylet is gone: shutdown would wait on it
            ray.shutdown()
        if self._local_cluster is not None:
            self._local_cluster.shutdown()
        if self._watchdog is not None:
            self._watchdog.terminate()

    def _connect_ray(self) -> None:
        import ray

        settings = self._settings
        if settings.ray_address:
            ray.init(
                address=settings.ray_address,
                namespace="gangway",
                log_to_driver=False,
                _node_ip_address=settings.ray_node_ip or None,
            )
            log.info(
                "joined Ray at %s from node %s",
                settings.ray_address,
                ray.get_runtime_context().get_node_id(),
            )
            return
        shape = LocalClusterShape(
            num_nodes=settings.local_nodes,
            gpus_per_node=settings.local_gpus_per_node,
            cpus_per_node=settings.local_cpus_per_node,
        )
        self._local_cluster = start_local_cluster(shape, ray_directory(settings.data_dir))
        self._watchdog = start_watchdog(self._local_cluster)
        log.info(
            "started a local Ray: %d nodes x %d logical GPUs (session %s)",
            shape.num_nodes,
            shape.gpus_per_node,
            self._local_cluster.head_node.get_session_dir_path(),
        )


def _sweep_telemetry(sweeper: TelemetrySweeper, stop: threading.Event, interval_s: float) -> None:
    """Delete old logs and metrics every `interval_s` until the service stops; a failed
    sweep is logged and tried again next time (it only deletes)."""
    while not stop.wait(interval_s):
        try:
            pruned = sweeper.sweep()
        except Exception:
            log.exception("telemetry retention sweep failed")
            continue
        if any(astuple(pruned)):
            log.info(
                "retention: deleted %d log lines, %d metric samples, %d reported points",
                *astuple(pruned),
            )


@contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """`ray.init` installs a SIGTERM handler that raises SystemExit inside the event loop;
    keep uvicorn's, so SIGTERM stops the loop thread and Ray in order (`Runtime.stop`)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def build_app(settings: Settings) -> FastAPI:
    database_url = settings.resolved_database_url()
    upgrade_to_head(database_url)
    repo = JobRepository(make_engine(database_url))
    seeded = QueueRepository(repo.engine).seed(settings.quotas())
    if seeded:
        log.info("queues from GANGWAY_QUEUES created: %s", ", ".join(seeded))
    auth = AuthConfig(
        required=settings.auth_required(),
        admin_key=settings.admin_key.get_secret_value() if settings.admin_key else None,
    )
    if auth.required and auth.admin_key is None:
        log.warning("auth is on and GANGWAY_ADMIN_KEY is unset: only existing keys get in")
    runtime = Runtime(settings, repo)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        runtime.start()
        try:
            yield
        finally:
            runtime.stop()

    app = create_app(
        repo,
        lifespan=lifespan,
        on_change=runtime.wake.set,
        checkpoint_root=settings.checkpoint_root(),
        checkpoint_store=settings.checkpoint_store(),
        outputs_root=settings.outputs_root(),
        outputs_store=settings.outputs_store(),
        storage_quota_bytes=settings.storage_quota_bytes,
        models_root=settings.models_root(),
        model_store=settings.model_store(),
        auth=auth,
        policy=settings.policy(),
        submit_policy=policy_from_settings(
            auth_required=auth.required,
            kinds={str(role): list(k) for role, k in settings.allowed_entrypoints.items()},
            script_roots=settings.script_roots,
            function_modules=settings.function_modules,
        ),
        packages_root=settings.packages_root(),
        package_max_bytes=settings.package_max_bytes,
        allowed_hosts=allowed_hosts(settings.host, settings.allowed_hosts),
        limits=settings.limits(),
    )
    app.state.runtime = runtime
    return app


class ServiceFailed(SystemExit):
    """The service stopped itself for a fault only a restart mends (its Ray node lost)."""


class UnsafeBind(SystemExit):
    """Serving without auth where others can reach it."""


def check_bind(settings: Settings) -> None:
    """Without auth every caller is an admin: serve only on loopback unless told to."""
    if settings.auth_required() or settings.allow_remote_without_auth:
        return
    if settings.host not in LOOPBACK_HOSTS:
        raise UnsafeBind(
            f"refusing to serve on {settings.host} with auth off: anyone who reaches it "
            "could run code as this service. Turn auth on (GANGWAY_AUTH=true with "
            "GANGWAY_ADMIN_KEY), bind 127.0.0.1, or set GANGWAY_ALLOW_REMOTE_WITHOUT_AUTH=true"
        )


class NoSandbox(SystemExit):
    """Auth on (strangers share the service) on a host that cannot sandbox their jobs."""


def check_sandbox(settings: Settings) -> None:
    """Say how rank programs will be confined, and refuse a multi-user service whose own
    (embedded) Ray cannot confine them, unless the admin chose that explicitly. With an
    external Ray each node checks for itself: a rank that cannot be sandboxed fails."""
    mode = settings.sandbox_mode()
    if mode is SandboxMode.OFF:
        log.warning("rank sandbox: off (GANGWAY_SANDBOX=off): jobs run as this service's user")
        return
    if settings.ray_address:
        log.info("rank sandbox: %s, checked by each node of the Ray cluster", mode.value)
        return
    support = sandbox.detect()
    if support.sandboxed:
        log.info("rank sandbox: %s (%s)", support.kind, support.detail)
    elif mode is SandboxMode.REQUIRED:
        raise NoSandbox(
            f"refusing to start: auth is on, so jobs must run sandboxed, but this host cannot "
            f"({support.detail}). Install bubblewrap, or set GANGWAY_SANDBOX=preferred to run "
            "every user's jobs as this service's user"
        )
    else:
        log.warning("rank sandbox: none on this host (%s): jobs run as this user", support.detail)


def serve(settings: Settings) -> None:
    check_bind(settings)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    check_sandbox(settings)
    app = build_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info")
    )
    runtime: Runtime = app.state.runtime
    # A runtime that fails stops the server as SIGTERM would, but uvicorn re-raises a
    # signal it caught once it has stopped, and a process killed by SIGTERM reads as a
    # clean stop to a service manager: this way the process exits 1, saying why.
    runtime.stop_service = lambda: setattr(server, "should_exit", True)
    server.run()
    if runtime.failed is not None:
        raise ServiceFailed(f"gangway serve stopped: {runtime.failed}")
