"""The model registry over REST: `/v1/models`.

Who may do what, with auth on (off: every caller is an admin):
- register a version: the owner of the job it comes from, and, for an existing model,
  its owner (or an admin);
- list, read, download: the model's owner, its readers (users by name, and the members
  of a queue named `queue:<name>`), admins;
- move aliases, change readers, delete a version: the owner or an admin.

A caller who may not read a model gets the 404 a missing model gets, not a 403 naming
its owner: that a model exists, and whose it is, is its readers' to know. A reader who
asks to change it gets a 403. A download sends a file only after its SHA-256 matched the
one recorded at registration; a changed or missing file is a 409, never served.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from api.auth import Caller, Principal, current_caller, require_owner
from api.convert import job_info, reading_the_store, shown_spec, submitted_spec
from api.errors import FieldError, StoreUnavailable
from api.routes import ERROR_RESPONSES, JobId, OnChange, Repo, create_job
from gangway.models import (
    ALIAS_NAME,
    MODEL_NAME,
    AliasSet,
    Builtin,
    ErrorBody,
    Function,
    JobInfo,
    JobSubmit,
    ModelExport,
    ModelFile,
    ModelInfo,
    ModelList,
    ModelRef,
    ModelRegister,
    ModelVersionInfo,
    ReadersSet,
)
from gangway.paths import BadPath, path_parts
from scheduler.store import JobRecord, JobRepository, QueueRepository
from scheduler.store.model_files import (
    TamperedFile,
    copy_checkpoint,
    remove_version,
    verified,
    version_directory,
)
from scheduler.store.output_usage import QuotaUse, storage_usage
from scheduler.store.registry import (
    QUEUE_READER,
    FileDigest,
    ModelNotFound,
    ModelRegistry,
    ModelVersion,
    QuotaExceeded,
    RegisteredModel,
)
from scheduler.store.remote_models import RemoteModelFiles, StoreFailed, UnkeepableName
from workers.checkpoint_layout import completed, job_directory, step_of
from workers.checkpoint_store import CheckpointStore

router = APIRouter(dependencies=[Depends(current_caller)])
EXPORT_TARGET = "workers.program.export:export_model"
RESPONSES: dict[int | str, dict[str, object]] = {
    **ERROR_RESPONSES,
    403: {"model": ErrorBody, "description": "a reader asking to change the model"},
    404: {
        "model": ErrorBody,
        "description": "no such model, version, alias or file (or none the caller may read)",
    },
    409: {
        "model": ErrorBody,
        "description": "a file changed since registration; a version number just taken",
    },
}
ModelName = Annotated[str, PathParam(pattern=MODEL_NAME)]
Alias = Annotated[str, PathParam(pattern=ALIAS_NAME)]
VersionRef = Annotated[
    str, PathParam(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$", description="a number or an alias")
]


def _registry(request: Request) -> ModelRegistry:
    registry: ModelRegistry = request.app.state.registry
    return registry


Registry = Annotated[ModelRegistry, Depends(_registry)]


def _root(request: Request) -> Path:
    root: Path | None = request.app.state.models_root
    if root is None:
        raise FieldError("name", "this service keeps no models (it was started without storage)")
    return root


def _model_store(request: Request) -> RemoteModelFiles | None:
    """Where versions' files live when storage is named by a URL; None: `_root`."""
    store: RemoteModelFiles | None = request.app.state.model_store
    return store


def _readable(registry: ModelRegistry, name: str, caller: Principal) -> RegisteredModel:
    model = registry.model(name)
    if not model.readable_by(caller):
        raise ModelNotFound(f"no model {name!r}")
    return model


def _check_readers(request: Request, readers: list[str]) -> None:
    """A queue among the readers must have members: an open queue names no one, and
    reading it as "anyone who submits there" would let anyone make themselves a reader."""
    queues: QueueRepository = request.app.state.queue_store
    with_members = queues.members()
    for index, reader in enumerate(readers):
        queue = reader.removeprefix(QUEUE_READER)
        if queue != reader and queue not in with_members:
            raise FieldError(
                f"readers.{index}",
                f"queue {queue!r} has no members, so it names no reader; an admin sets "
                "them with `gangway queues members`",
            )


def _changeable(registry: ModelRegistry, name: str, caller: Principal, may: str) -> RegisteredModel:
    model = _readable(registry, name, caller)
    require_owner(caller, model.owner, f"model {name!r}", may=may, field="name")
    return model


@router.post("/v1/models", response_model=ModelVersionInfo, status_code=201, responses=RESPONSES)
def register(
    body: ModelRegister, caller: Caller, request: Request, repo: Repo, registry: Registry
) -> ModelVersionInfo:
    """The next version of model `name`, from a complete checkpoint of job `job_id`: its
    files copied into the registry with their SHA-256, the job's spec, the metrics it
    reported at that step."""
    _root(request)  # 422 when the service keeps no models
    job = repo.get(body.job_id)  # 404 for an unknown job
    require_owner(caller, job.user, f"job {job.id}", may="register its checkpoints", field="job_id")
    try:
        existing = registry.model(body.name)
    except ModelNotFound:
        existing = None
    if existing is not None:
        _changeable(registry, body.name, caller, "add versions")
    if existing is None:  # a new version of an existing model keeps its readers
        _check_readers(request, body.readers)
    owner = existing.owner if existing is not None else caller.name
    with _checkpoint(request, job, body.step, owner) as (source, step):
        number, holder = registry.reserve_version(body.name, owner=owner, readers=body.readers)
        if holder != owner:  # someone else created the name a moment ago
            raise ModelNotFound(f"no model {body.name!r}")
        files = _copied(request, registry, source, (body.name, number), owner)
    version = ModelVersion(
        model=body.name,
        version=number,
        job_id=job.id,
        attempt=job.attempt,
        step=step,
        spec=shown_spec(submitted_spec(job), shows_env=False).model_dump(mode="json"),
        metrics=repo.values_at(job.id, step),
        files=files,
        created_by=caller.name,
        created_at=repo.now(),
    )
    try:
        stored = registry.add_version(version)
    except Exception:
        if not _has_version(registry, body.name, number):
            _remove_files(request, body.name, number)
        raise
    return _version_info(stored, {})


def _has_version(registry: ModelRegistry, name: str, number: int) -> bool:
    """Whether the version's row is there after its insert failed: the commit may have
    landed with its answer lost. When the database cannot say, it may be: its files stay
    (at worst unnamed files under a number never handed out again)."""
    try:
        registry.version(name, str(number))
    except ModelNotFound:
        return False
    except Exception:
        return True
    return True


def _copied(
    request: Request,
    registry: ModelRegistry,
    source: Path,
    version: tuple[str, int],
    owner: str,
) -> tuple[FileDigest, ...]:
    """The checkpoint copied as the files of `version` (model, number), in the models
    folder or the store, within what the owner's storage quota has left (409 past it;
    their jobs' outputs count too); a checkpoint its job changed under the copy is a 422
    naming `job_id`; a store that cannot be written, a 503."""
    use, store, (name, number) = _usage(request, registry, owner), _model_store(request), version
    try:
        if store is None:
            target = version_directory(_root(request), name, number)
            return copy_checkpoint(source, target, max_bytes=use.remaining_bytes)
        return store.store(source, name, number, max_bytes=use.remaining_bytes)
    except UnkeepableName as exc:
        raise FieldError("job_id", str(exc)) from exc
    except StoreFailed as exc:
        raise StoreUnavailable(f"the model store could not take the version: {exc}") from exc
    except QuotaExceeded as exc:
        raise _over_quota(use, owner, str(exc)) from exc
    except OSError as exc:
        raise FieldError("job_id", f"the checkpoint changed while it was copied: {exc}") from exc


def _remove_files(request: Request, name: str, number: int) -> None:
    store = _model_store(request)
    if store is None:
        remove_version(_root(request), name, number)
    else:
        with reading_the_store("model"):
            store.remove(name, number)


def _usage(request: Request, registry: ModelRegistry, owner: str) -> QuotaUse:
    repo: JobRepository = request.app.state.repo
    quota: int = request.app.state.storage_quota_bytes
    with reading_the_store("outputs"):
        return storage_usage(
            repo, registry, request.app.state.outputs, owner, quota_bytes=quota, now=repo.now()
        )


def _over_quota(use: QuotaUse, owner: str, what: str) -> QuotaExceeded:
    return QuotaExceeded(
        f"{owner}'s files hold {use.used_bytes:,} bytes of their {use.quota_bytes:,} "
        f"({use.model_bytes:,} in model versions, the rest in job outputs); {what} "
        "(delete versions or outputs, or ask an admin for a larger quota)"
    )


@contextmanager
def _checkpoint(
    request: Request, job: JobRecord, step: int | None, owner: str
) -> Iterator[tuple[Path, int]]:
    """The job's checkpoint at `step` (its newest when None), complete, as a local folder
    (one in a store is fetched into a temporary one for as long as this lasts); 422
    naming the field when there is none."""
    store: CheckpointStore | None = request.app.state.checkpoint_store
    if store is not None:
        job_store = store.job(job.id)
        with reading_the_store():
            saved = {c.step: c for c in job_store.listing()}
        chosen = saved[_chosen(job, step, sorted(saved))]
        use = _usage(request, request.app.state.registry, owner)
        if chosen.bytes > use.remaining_bytes:  # before a byte is fetched
            raise _over_quota(use, owner, f"the checkpoint holds {chosen.bytes:,} bytes")
        with tempfile.TemporaryDirectory(prefix="gangway-register-") as folder:
            with reading_the_store():
                local = job_store.download(chosen, Path(folder))
            yield local, chosen.step
        return
    root: Path | None = request.app.state.checkpoint_root
    directory = job_directory(root, job.id) if root is not None else None
    found = completed(directory) if directory is not None and directory.is_dir() else []
    done = {step_of(p): p for p in found if not p.is_symlink()}  # a job may plant links
    wanted = _chosen(job, step, sorted(done))
    yield done[wanted], wanted


def _chosen(job: JobRecord, step: int | None, steps: list[int]) -> int:
    """`step` if the job has a complete checkpoint there, its newest when None."""
    if step is None:
        if not steps:
            raise FieldError("job_id", f"job {job.id} has no complete checkpoint")
        return steps[-1]
    if step not in steps:
        listed = ", ".join(str(s) for s in steps) or "none"
        raise FieldError(
            "step", f"job {job.id} has no complete checkpoint at step {step} (it has: {listed})"
        )
    return step


@router.get("/v1/models", response_model=ModelList, responses=RESPONSES)
def list_models(caller: Caller, registry: Registry) -> ModelList:
    """The models the caller may read, by name."""
    readable = [m for m in registry.models() if m.readable_by(caller)]
    return ModelList(models=[model_info(m) for m in readable])


@router.get("/v1/models/{name}", response_model=ModelInfo, responses=RESPONSES)
def get_model(name: ModelName, caller: Caller, registry: Registry) -> ModelInfo:
    """The model, every version (oldest first, with its lineage and digests), its aliases."""
    return model_info(_readable(registry, name, caller))


@router.get(
    "/v1/models/{name}/versions/{ref}", response_model=ModelVersionInfo, responses=RESPONSES
)
def get_version(
    name: ModelName, ref: VersionRef, caller: Caller, registry: Registry
) -> ModelVersionInfo:
    model = _readable(registry, name, caller)
    return _version_info(registry.version(name, ref), model.aliases)


@router.get("/v1/models/{name}/versions/{ref}/files/{path:path}", responses=RESPONSES)
def download_file(
    *,
    name: ModelName,
    ref: VersionRef,
    path: str,
    caller: Caller,
    request: Request,
    registry: Registry,
) -> FileResponse:
    """One file of the version, sent only once its bytes match the recorded SHA-256."""
    _readable(registry, name, caller)
    version = registry.version(name, ref)
    try:
        wanted = "/".join(path_parts(path))
    except BadPath as exc:
        raise FieldError("path", str(exc)) from exc
    digest = next((f for f in version.files if f.path == wanted), None)
    if digest is None:
        raise ModelNotFound(f"{name} v{version.version} has no file {wanted!r}")
    store, cleanup = _model_store(request), None
    if store is None:
        checked = verified(_root(request), name, version.version, digest)
    else:
        with reading_the_store("model", passes=(TamperedFile,)):
            checked, cleanup = store.verified_copy(name, version.version, digest)
    return FileResponse(
        checked,
        media_type="application/octet-stream",
        headers={"X-Checksum-Sha256": digest.sha256},
        background=BackgroundTask(cleanup) if cleanup is not None else None,
    )


@router.post(
    "/v1/models/{name}/versions/{ref}/export",
    response_model=JobInfo,
    status_code=201,
    responses=RESPONSES,
)
def export(
    *,
    name: ModelName,
    ref: VersionRef,
    body: ModelExport,
    caller: Caller,
    request: Request,
    repo: Repo,
    registry: Registry,
    on_change: OnChange,
) -> JobInfo:
    """Submit the job that exports the version (`workers.program.export`): the caller's,
    one rank, started from the version; its outputs are the files. A job the service
    chose, so the admins' entrypoint policy, which is about users' code, does not apply."""
    _readable(registry, name, caller)
    version = registry.version(name, ref)
    trained = version.spec.get("entrypoint", {})
    if trained.get("kind") != "builtin":
        raise FieldError(
            "name", f"{name} v{version.version} was not trained by the built-in trainer"
        )
    submit = JobSubmit(
        name=f"export-{name}-v{version.version}",
        queue=body.queue,
        user=caller.name,
        entrypoint=Function(target=EXPORT_TARGET, kwargs=_export_kwargs(version.spec, body)),
        init_from=ModelRef(model=name, version=version.version),
    )
    nodes = repo.nodes()
    record, _ = create_job(submit, caller, repo=repo, request=request, nodes=nodes)
    on_change()
    return job_info(record, {n.id: n.name for n in nodes}, shows_env=True)


def _export_kwargs(spec: dict[str, Any], body: ModelExport) -> dict[str, Any]:
    """What the export needs of the trained job: its model and held-out split, and its
    validation batch (dp x batch_size sequences), so the figures compare with its own."""
    trained = {**Builtin().model_dump(), **spec["entrypoint"]}
    parallelism = spec.get("parallelism")
    dp = parallelism.get("dp", 1) if isinstance(parallelism, dict) else 1
    degree = dp["max"] if isinstance(dp, dict) else int(dp)
    return {
        "model": trained["model"],
        "seed": trained["seed"],
        "data_path": trained["data_path"],
        "eval_batch": degree * int(trained["batch_size"]),
        "eval_batches": body.eval_batches,
        "quantize": body.quantize,
    }


@router.put("/v1/models/{name}/aliases/{alias}", response_model=ModelInfo, responses=RESPONSES)
def set_alias(
    name: ModelName, alias: Alias, body: AliasSet, caller: Caller, registry: Registry
) -> ModelInfo:
    """Point `alias` (production, staging, ...) at a version; it moves if it was elsewhere."""
    _changeable(registry, name, caller, "move its aliases")
    registry.set_alias(name, alias, body.version)
    return model_info(registry.model(name))


@router.delete("/v1/models/{name}/aliases/{alias}", status_code=204, responses=RESPONSES)
def remove_alias(name: ModelName, alias: Alias, caller: Caller, registry: Registry) -> Response:
    _changeable(registry, name, caller, "move its aliases")
    registry.remove_alias(name, alias)
    return Response(status_code=204)


@router.put("/v1/models/{name}/readers", response_model=ModelInfo, responses=RESPONSES)
def set_readers(
    name: ModelName, body: ReadersSet, caller: Caller, request: Request, registry: Registry
) -> ModelInfo:
    """Who besides its owner (and admins) may list, read and download the model: users by
    name, and `queue:<name>` for the members of a queue."""
    _changeable(registry, name, caller, "choose its readers")
    _check_readers(request, body.readers)
    registry.set_readers(name, body.readers)
    return model_info(registry.model(name))


@router.delete("/v1/models/{name}/versions/{ref}", status_code=204, responses=RESPONSES)
def delete_version(
    *,
    name: ModelName,
    ref: Annotated[
        int, PathParam(ge=1, le=2**31 - 1, description="a version number, never an alias")
    ],
    caller: Caller,
    request: Request,
    registry: Registry,
) -> Response:
    """The version, its files and the aliases on it; the model goes with its last. By
    number only: a delete names what it deletes, not what an alias points at now."""
    _changeable(registry, name, caller, "delete its versions")
    registry.delete_version(name, ref)
    _remove_files(request, name, ref)
    return Response(status_code=204)


@router.get("/v1/jobs/{job_id}/models", response_model=list[ModelVersionInfo], responses=RESPONSES)
def job_models(
    job_id: JobId, caller: Caller, repo: Repo, registry: Registry
) -> list[ModelVersionInfo]:
    """Lineage: the versions made from the job's checkpoints that the caller may read."""
    repo.get(job_id)  # 404 for an unknown job
    found = []
    for version in registry.versions_of_job(job_id):
        model = registry.model(version.model)
        if model.readable_by(caller):
            found.append(_version_info(version, model.aliases))
    return found


def model_info(model: RegisteredModel) -> ModelInfo:
    return ModelInfo(
        name=model.name,
        owner=model.owner,
        readers=list(model.readers),
        created_at=model.created_at,
        aliases=dict(model.aliases),
        versions=[_version_info(v, model.aliases) for v in model.versions],
    )


def _version_info(version: ModelVersion, aliases: dict[str, int]) -> ModelVersionInfo:
    return ModelVersionInfo(
        model=version.model,
        version=version.version,
        aliases=sorted(a for a, v in aliases.items() if v == version.version),
        job_id=version.job_id,
        attempt=version.attempt,
        step=version.step,
        spec=version.spec,
        metrics=version.metrics,
        files=[ModelFile(path=f.path, bytes=f.bytes, sha256=f.sha256) for f in version.files],
        bytes=sum(f.bytes for f in version.files),
        created_by=version.created_by,
        created_at=version.created_at,
    )
