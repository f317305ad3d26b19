"""REST v1 administration: who am I, users and their API keys, queue quotas and members,
calibration runs.

Users and queues are admin business; a user may list and issue or revoke their own keys
(to rotate one without asking an admin).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi import Path as PathParam

from api.auth import RESERVED_NAMES, Admin, Caller, current_caller, require_owner
from api.convert import job_info, queue_quota
from api.errors import FieldError
from api.routes import ERROR_RESPONSES, MAX_ID, Repo, changed, queues_now
from gangway.models import (
    ApiKeyInfo,
    IssuedApiKey,
    JobInfo,
    QueueInfo,
    QueueMembers,
    QueueName,
    QueueSpec,
    UserCreate,
    UserInfo,
    UserName,
    WhoAmI,
)
from scheduler.runtime.calibration import CalibrationRunning, submit_calibration
from scheduler.runtime.trainer_shapes import common_node_type
from scheduler.store import AccountRepository, ApiKey, QueueRepository, User

router = APIRouter(dependencies=[Depends(current_caller)], responses=ERROR_RESPONSES)


def accounts(request: Request) -> AccountRepository:
    store: AccountRepository = request.app.state.accounts
    return store


def queue_store(request: Request) -> QueueRepository:
    store: QueueRepository = request.app.state.queue_store
    return store


Accounts = Annotated[AccountRepository, Depends(accounts)]
Queues = Annotated[QueueRepository, Depends(queue_store)]
UserPath = Annotated[UserName, PathParam(description="the user's name")]
QueuePath = Annotated[QueueName, PathParam(description="the queue's name")]


@router.get("/v1/whoami", response_model=WhoAmI)
def whoami(caller: Caller, request: Request) -> WhoAmI:
    role = "admin" if caller.is_admin else "user"
    return WhoAmI(
        name=caller.name,
        role=role,
        auth_enabled=request.app.state.auth.required,
        queues=sorted(caller.queues),
    )


@router.get("/v1/users", response_model=list[UserInfo])
def list_users(_: Admin, store: Accounts) -> list[UserInfo]:
    return [_user_info(user) for user in store.users()]


@router.post("/v1/users", status_code=201, response_model=UserInfo)
def create_user(body: UserCreate, _: Admin, store: Accounts) -> UserInfo:
    """A new user (409 if the name is taken, 422 if it is reserved); then issue them a key."""
    if body.name.lower() in RESERVED_NAMES:
        raise FieldError(
            "name", f"{body.name!r} is reserved (the bootstrap admin, auth off, calibration runs)"
        )
    return _user_info(store.create_user(body.name, body.role))


@router.post("/v1/users/{name}/keys", status_code=201, response_model=IssuedApiKey)
def issue_key(name: UserPath, caller: Caller, store: Accounts) -> IssuedApiKey:
    """A new key for the user; the response is the only place its secret appears."""
    require_owner(caller, name, f"user {name}'s keys")
    key, secret = store.issue_key(name)
    return IssuedApiKey(**_key_info(key).model_dump(), secret=secret)


@router.get("/v1/users/{name}/keys", response_model=list[ApiKeyInfo])
def list_keys(name: UserPath, caller: Caller, store: Accounts) -> list[ApiKeyInfo]:
    require_owner(caller, name, f"user {name}'s keys")
    return [_key_info(key) for key in store.keys(name)]


@router.post("/v1/keys/{key_id}/revoke", response_model=ApiKeyInfo)
def revoke_key(
    key_id: Annotated[int, PathParam(ge=1, le=MAX_ID)], caller: Caller, store: Accounts
) -> ApiKeyInfo:
    """The key stops working at once; it stays listed, with when it was revoked."""
    require_owner(caller, store.key(key_id).user, f"key {key_id}")
    return _key_info(store.revoke_key(key_id))


@router.put(
    "/v1/queues/{name}",
    response_model=QueueInfo,
    responses={201: {"model": QueueInfo, "description": "the queue was created"}},
)
def put_queue(
    name: QueuePath,
    spec: QueueSpec,
    *,
    _: Admin,
    store: Queues,
    repo: Repo,
    response: Response,
    request: Request,
) -> QueueInfo:
    """Create or change a queue's quota (201 when created); the scheduler applies it on
    its next pass. Jobs already holding GPUs beyond a lowered quota are not stopped for
    it; they count as borrowers, reclaimed first when the guarantee's owners need GPUs."""
    if store.put(name, queue_quota(spec)):
        response.status_code = 201
    changed(request)()
    return _queue_info(name, store, repo)


@router.delete("/v1/queues/{name}", status_code=204)
def delete_queue(name: QueuePath, _: Admin, store: Queues, request: Request) -> Response:
    """Forget a queue's quota (404 if it has none). Its jobs stay: the queue goes on with
    no guarantee and no borrowing limit, like any queue nobody configured."""
    store.delete(name)
    changed(request)()
    return Response(status_code=204)


@router.post("/v1/calibrations", status_code=201, response_model=list[JobInfo])
def calibrate(_: Admin, repo: Repo, request: Request) -> list[JobInfo]:
    """Queue the calibration runs for the node type most live nodes have
    (`scheduler.runtime.calibration`): a few short built-in jobs of user gangway at the
    lowest priority, one after another. Once three succeed, estimates and
    `"parallelism": "auto"` use the step-time model fitted to them (with every earlier
    run) instead of assumed speeds. 409 with no live node, or while earlier runs go on."""
    nodes = repo.nodes()
    node = common_node_type(nodes)
    if node is None:
        raise HTTPException(409, "no live node to calibrate")
    try:
        made = submit_calibration(repo, node)
    except CalibrationRunning as exc:
        raise HTTPException(409, str(exc)) from exc
    changed(request)()
    names = {n.id: n.name for n in nodes}
    return [job_info(job, names, shows_env=True) for job in made]


@router.put("/v1/queues/{name}/members", response_model=QueueInfo)
def put_queue_members(
    name: QueuePath,
    body: QueueMembers,
    *,
    _: Admin,
    store: Queues,
    accounts: Accounts,
    repo: Repo,
) -> QueueInfo:
    """Who the queue is for: only they (and admins) may submit to it from now on, and
    they read the models shared with `queue:<name>`; jobs already in it stay. An empty
    list opens it to every user. Every member must be a user (422 naming the entry)."""
    users = {user.name for user in accounts.users()}
    for index, member in enumerate(body.members):
        if member not in users:
            raise FieldError(f"members.{index}", f"no user {member!r}")
    store.set_members(name, body.members)
    return _queue_info(name, store, repo)


def _queue_info(name: str, store: QueueRepository, repo: Repo) -> QueueInfo:
    return next(info for info in queues_now(store, repo, also=name) if info.name == name)


def _user_info(user: User) -> UserInfo:
    role = "admin" if user.is_admin else "user"
    return UserInfo(name=user.name, role=role, created_at=user.created_at)


def _key_info(key: ApiKey) -> ApiKeyInfo:
    return ApiKeyInfo(
        id=key.id,
        user=key.user,
        prefix=key.prefix,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
    )
