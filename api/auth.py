"""Who is calling: API keys (`Authorization: Bearer <secret>`) mapped to users and roles.

Users may submit (to open queues and those they are members of), list and read every
job, change (cancel, reprioritize) their own and read their own jobs' outputs;
admins may do anything, including managing users, keys and queues. With auth off (the
embedded single-user default) every caller is an admin named `default`. The bootstrap
admin key from the settings is an admin named `admin` that exists in no table: it is how
the first users are created.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from scheduler.model import CALIBRATION_USER
from scheduler.store import AccountRepository, QueueRepository

_bearer = HTTPBearer(auto_error=False, description="an API key issued by `gangway users key`")


@dataclass(frozen=True)
class Principal:
    name: str
    is_admin: bool
    queues: frozenset[str] = frozenset()  # the queues the caller is a member of


@dataclass(frozen=True)
class AuthConfig:
    required: bool = False
    admin_key: str | None = None


NO_AUTH_CALLER = Principal("default", is_admin=True)
BOOTSTRAP_ADMIN = Principal("admin", is_admin=True)
# Names that mean someone else already: a user by one of them would own their jobs (the
# service's own calibration runs among them).
RESERVED_NAMES = frozenset({NO_AUTH_CALLER.name, BOOTSTRAP_ADMIN.name, CALIBRATION_USER})


class Unauthorized(Exception):
    """401: no key, or one that is unknown or revoked."""


class Forbidden(Exception):
    """403: a known caller asking for what their role does not allow."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def current_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    config: AuthConfig = request.app.state.auth
    if not config.required:
        return NO_AUTH_CALLER
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("this service needs an API key: Authorization: Bearer <key>")
    secret = credentials.credentials
    if config.admin_key and hmac.compare_digest(secret.encode(), config.admin_key.encode()):
        return BOOTSTRAP_ADMIN
    accounts: AccountRepository = request.app.state.accounts
    user = accounts.authenticate(secret)
    if user is None:
        raise Unauthorized("unknown or revoked API key")
    queues: QueueRepository = request.app.state.queue_store
    return Principal(user.name, user.is_admin, queues.queues_of(user.name))


Caller = Annotated[Principal, Depends(current_caller)]


def admin_only(caller: Caller) -> Principal:
    if not caller.is_admin:
        raise Forbidden(f"{caller.name} is not an admin")
    return caller


Admin = Annotated[Principal, Depends(admin_only)]


def require_owner(
    caller: Principal, owner: str, what: str, *, may: str = "change it", field: str | None = None
) -> None:
    """Users change only what is theirs (and read what is private to it: a job's
    outputs); admins anything. The refusal names no one else: who owns a key, say, is
    not the caller's to learn."""
    if not caller.is_admin and caller.name != owner:
        raise Forbidden(
            f"{what} is not {caller.name}'s; only its owner or an admin may {may}", field=field
        )


def require_queue_member(queues: QueueRepository, queue: str, owner: str) -> None:
    """A queue with members takes only their jobs (and admins'); one without, anyone's.
    The job's owner is checked, not the caller: an admin submitting for a user puts a
    job in the queue that is that user's (`QueueRepository.admits`)."""
    if not queues.admits(queue, owner):
        raise Forbidden(
            f"queue {queue!r} is for its members and {owner} is not one; an admin "
            "adds members with `gangway queues members`",
            field="queue",
        )


def sees_env(caller: Principal, owner: str) -> bool:
    """A job's env values (API keys, tokens put there) are its owner's and the admins' to
    read; others see the names only."""
    return caller.is_admin or caller.name == owner
