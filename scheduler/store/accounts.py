"""Users and their API keys.

A key is 32 random bytes (`gw_` + URL-safe base64); only its SHA-256 is stored. A fast
hash is enough here, unlike for passwords: the secret has 256 bits of entropy, so there is
nothing to guess, and every request can look its key up by one indexed equality.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler.store.base import utcnow
from scheduler.store.tables import ApiKeyRow, UserRow

ADMIN_ROLE = "admin"
ROLES = ("user", ADMIN_ROLE)
KEY_PREFIX = "gw_"


class UserExists(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"user {name!r} already exists")
        self.name = name


class UserNotFound(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no user {name!r}")
        self.name = name


class ApiKeyNotFound(LookupError):
    def __init__(self, key_id: int) -> None:
        super().__init__(f"no API key {key_id}")
        self.key_id = key_id


@dataclass(frozen=True)
class User:
    id: int
    name: str
    role: str
    created_at: datetime

    @property
    def is_admin(self) -> bool:
        return self.role == ADMIN_ROLE


@dataclass(frozen=True)
class ApiKey:
    id: int
    user: str
    prefix: str  # the secret's first characters, to tell keys apart in a listing
    created_at: datetime
    revoked_at: datetime | None


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class AccountRepository:
    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def create_user(self, name: str, role: str) -> User:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        try:
            with Session(self._engine) as session, session.begin():
                row = UserRow(name=name, role=role, created_at=self._clock())
                session.add(row)
                session.flush()
                return _user(row)
        except IntegrityError as exc:
            raise UserExists(name) from exc

    def users(self) -> list[User]:
        with Session(self._engine) as session:
            return [_user(r) for r in session.scalars(select(UserRow).order_by(UserRow.name))]

    def user(self, name: str) -> User:
        with Session(self._engine) as session:
            return _user(_user_row(session, name))

    def issue_key(self, user_name: str) -> tuple[ApiKey, str]:
        """A new key for the user and its secret (the only time the secret exists)."""
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        with Session(self._engine) as session, session.begin():
            user = _user_row(session, user_name)
            row = ApiKeyRow(
                user_id=user.id,
                secret_sha256=secret_digest(secret),
                prefix=secret[:10],
                created_at=self._clock(),
            )
            session.add(row)
            session.flush()
            return _api_key(row, user.name), secret

    def keys(self, user_name: str) -> list[ApiKey]:
        with Session(self._engine) as session:
            user = _user_row(session, user_name)
            rows = session.scalars(
                select(ApiKeyRow).where(ApiKeyRow.user_id == user.id).order_by(ApiKeyRow.id)
            )
            return [_api_key(r, user.name) for r in rows]

    def key(self, key_id: int) -> ApiKey:
        with Session(self._engine) as session:
            found = session.execute(
                select(ApiKeyRow, UserRow.name)
                .join(UserRow, UserRow.id == ApiKeyRow.user_id)
                .where(ApiKeyRow.id == key_id)
            ).first()
            if found is None:
                raise ApiKeyNotFound(key_id)
            return _api_key(found[0], found[1])

    def revoke_key(self, key_id: int) -> ApiKey:
        """Revoked keys stay listed (when, and whose), and authenticate no one."""
        with Session(self._engine) as session, session.begin():
            session.execute(
                update(ApiKeyRow)
                .where(ApiKeyRow.id == key_id, ApiKeyRow.revoked_at.is_(None))
                .values(revoked_at=self._clock())
            )
        return self.key(key_id)

    def authenticate(self, secret: str) -> User | None:
        """The user a live key belongs to; None for an unknown or revoked key."""
        with Session(self._engine) as session:
            row = session.scalars(
                select(UserRow)
                .join(ApiKeyRow, ApiKeyRow.user_id == UserRow.id)
                .where(
                    ApiKeyRow.secret_sha256 == secret_digest(secret),
                    ApiKeyRow.revoked_at.is_(None),
                )
            ).first()
            return _user(row) if row is not None else None


def _user_row(session: Session, name: str) -> UserRow:
    row = session.scalars(select(UserRow).where(UserRow.name == name)).first()
    if row is None:
        raise UserNotFound(name)
    return row


def _user(row: UserRow) -> User:
    return User(row.id, row.name, row.role, row.created_at)


def _api_key(row: ApiKeyRow, user_name: str) -> ApiKey:
    return ApiKey(row.id, user_name, row.prefix, row.created_at, row.revoked_at)
