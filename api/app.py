"""The FastAPI app factory. It needs only a repository: the app never talks to Ray."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.middleware.trustedhost import TrustedHostMiddleware

from api.admin import router as admin_router
from api.auth import AuthConfig
from api.browser import CrossSiteGuard
from api.errors import install_error_handlers
from api.estimate import Estimator
from api.limits import Limits, RequestLimits
from api.logstream import StreamSlots
from api.logstream import router as logstream_router
from api.metrics import router as metrics_router
from api.metrics import store_registry
from api.outputs import router as outputs_router
from api.packages import router as packages_router
from api.pipelines import router as pipelines_router
from api.policy import SubmitPolicy
from api.registry import router as registry_router
from api.routes import health_router
from api.routes import router as api_router
from api.sweeps import router as sweeps_router
from api.ui import fragments as ui_fragments
from api.ui import shells as ui_shells
from gangway.packaging import DEFAULT_MAX_BYTES
from scheduler.core import PolicyConfig
from scheduler.store import AccountRepository, JobRepository, QueueRepository
from scheduler.store.output_stores import outputs_storage
from scheduler.store.output_usage import DEFAULT_QUOTA_BYTES
from scheduler.store.packages import PackageStore
from scheduler.store.registry import ModelRegistry
from scheduler.store.remote_models import RemoteModelFiles
from scheduler.store.remote_outputs import RemoteOutputs
from workers.checkpoint_store import CheckpointStore

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def create_app(
    repo: JobRepository,
    *,
    lifespan: Lifespan | None = None,
    on_change: Callable[[], None] = lambda: None,
    checkpoint_root: Path | None = None,
    checkpoint_store: CheckpointStore | None = None,
    auth: AuthConfig | None = None,
    policy: PolicyConfig | None = None,
    submit_policy: SubmitPolicy | None = None,
    packages_root: Path | None = None,
    package_max_bytes: int = DEFAULT_MAX_BYTES,
    allowed_hosts: Collection[str] | None = None,
    limits: Limits | None = None,
    outputs_root: Path | None = None,
    outputs_store: RemoteOutputs | None = None,
    models_root: Path | None = None,
    model_store: RemoteModelFiles | None = None,
    storage_quota_bytes: int = DEFAULT_QUOTA_BYTES,
) -> FastAPI:
    """`on_change` is called after a request changed what the scheduler should do (a job
    submitted or cancelled): `serve` wakes its loop with it, so a new job is admitted in
    the next instant instead of the next interval. `checkpoint_root` is where the ranks
    write checkpoints (shared storage in production), listed per job, unless they live
    in `checkpoint_store` (hosts that share no disk). `auth` off (the
    default) lets every caller in as an admin; users, keys and queue quotas live in the
    repository's database. `submit_policy` (default: anything) is the admins' say on
    entrypoints; uploaded working directories live in `packages_root` (default: a new
    temporary directory). With auth off, cross-site state changes are refused, and so is
    a Host header not in `allowed_hosts` when given (see api.browser). `limits` bound what
    a request may send and a response return (see api.limits). `outputs_root` is where
    the rank supervisors copy what jobs wrote to their OUTPUTS_DIR (None: the app stores
    none), unless they upload it to `outputs_store`; `models_root` holds the registered
    model versions' files (None: no registry), unless `model_store` does. Each user's
    outputs and model versions together are bounded by `storage_quota_bytes` (see
    scheduler.store.output_usage)."""
    app = FastAPI(
        title="Gangway",
        version="0.1.0",
        description="Schedule and run distributed PyTorch training on GPU clusters.",
        lifespan=lifespan,
        # One schema per model: a job body is the same `JobSubmit` sent and read back,
        # its `secrets` marked writeOnly (sent, never returned), not a second copy.
        separate_input_output_schemas=False,
    )
    app.state.repo = repo
    app.state.on_change = on_change
    app.state.auth = auth or AuthConfig()
    app.state.accounts = AccountRepository(repo.engine)
    app.state.queue_store = QueueRepository(repo.engine)
    app.state.checkpoint_root = checkpoint_root
    app.state.checkpoint_store = checkpoint_store
    app.state.outputs = outputs_storage(outputs_root, outputs_store)
    app.state.models_root = models_root
    app.state.model_store = model_store
    app.state.storage_quota_bytes = storage_quota_bytes
    app.state.registry = ModelRegistry(repo.engine, clock=repo.now)
    app.state.limits = limits or Limits()
    app.state.streams = StreamSlots(app.state.limits.streams_per_caller)
    app.add_middleware(RequestLimits, limits=app.state.limits)
    app.state.metrics_registry = store_registry(repo)
    app.state.estimator = Estimator(repo, policy or PolicyConfig())  # the loop's policy
    app.state.submit_policy = submit_policy or SubmitPolicy()
    root = packages_root or Path(tempfile.mkdtemp(prefix="gangway-packages-"))
    app.state.packages = PackageStore(
        repo.engine,
        root,
        max_unpacked_bytes=app.state.limits.package_max_unpacked_bytes,
        max_files=app.state.limits.package_max_files,
    )
    app.state.package_max_bytes = package_max_bytes
    if not app.state.auth.required:
        app.add_middleware(CrossSiteGuard, hosts=allowed_hosts)
        if allowed_hosts is not None:
            app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    install_error_handlers(app)
    app.include_router(api_router)
    app.include_router(packages_router)
    app.include_router(outputs_router)
    app.include_router(registry_router)
    app.include_router(pipelines_router)
    app.include_router(sweeps_router)
    app.include_router(admin_router)
    app.include_router(health_router)
    app.include_router(logstream_router)
    app.include_router(ui_shells)
    app.include_router(ui_fragments)
    app.mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static")
    app.include_router(metrics_router)
    return app
