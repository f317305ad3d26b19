"""`gangway queues`, `gangway users`, `gangway whoami`: queue quotas, members and API keys.

Listing queues is for everyone; changing them (quotas, members), and managing users, is
for admins (with GANGWAY_API_KEY holding an admin's key, or the bootstrap
GANGWAY_ADMIN_KEY's value).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Literal

import typer

from gangway import cli_shared
from gangway.cli_shared import DEFAULT_URL, AsJson, Url, echo, echo_json, run
from gangway.models import ApiKeyInfo, QueueInfo, QueueSpec, wire_default

queues_app = typer.Typer(help="Queues: list them; admins set quotas and members.")
users_app = typer.Typer(help="Users and API keys (admins; users may manage their own keys).")


@queues_app.callback(invoke_without_command=True)
def queues(ctx: typer.Context, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Queues: guaranteed GPUs, borrowing limit, GPUs in use and borrowed, jobs."""
    if ctx.invoked_subcommand is not None:
        return
    with cli_shared.connect(url) as client:
        infos = run(client.queues)
    if as_json:
        echo_json(json.dumps([q.model_dump() for q in infos], indent=2))
        return
    _print_queues(infos)


@queues_app.command("set")
def set_queue(
    name: str,
    guaranteed: Annotated[int, typer.Option(help="GPUs the queue is owed")] = wire_default(
        QueueSpec, "guaranteed_gpus"
    ),
    borrow_limit: Annotated[
        int | None, typer.Option(help="idle GPUs it may borrow beyond; unset: any")
    ] = wire_default(QueueSpec, "borrow_limit_gpus"),
    weight: Annotated[
        float, typer.Option(help="share when queues contend (least usage / weight first)")
    ] = wire_default(QueueSpec, "weight"),
    url: Url = DEFAULT_URL,
) -> None:
    """Create or change a queue's quota; the scheduler applies it on its next pass."""
    with cli_shared.connect(url) as client:
        info = run(
            lambda: client.set_queue(
                name, guaranteed_gpus=guaranteed, borrow_limit_gpus=borrow_limit, weight=weight
            )
        )
    _print_queues([info])


@queues_app.command("members")
def set_members(
    name: str,
    users: Annotated[list[str] | None, typer.Argument(help="the queue's members")] = None,
    open_queue: Annotated[
        bool, typer.Option("--open", help="no members: every user may submit to it")
    ] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Set who the queue is for (admins): only they submit to it, and they read the
    models shared with `queue:NAME`. Without users, show them."""
    if users and open_queue:
        raise typer.BadParameter("name members or --open, not both")
    with cli_shared.connect(url) as client:
        if users or open_queue:
            members = run(lambda: client.set_queue_members(name, users or [])).members
        else:
            members = next((q.members for q in run(client.queues) if q.name == name), [])
    shown = ", ".join(members) if members else "every user (open)"
    echo(f"queue {name}: {shown}")


@queues_app.command("delete")
def delete_queue(name: str, url: Url = DEFAULT_URL) -> None:
    """Forget a queue's quota; its jobs stay, with no guarantee and no borrowing limit."""
    with cli_shared.connect(url) as client:
        run(lambda: client.delete_queue(name))
    echo(f"queue {name}: quota deleted")


def _print_queues(infos: Sequence[QueueInfo]) -> None:
    cli_shared.print_table(
        ["QUEUE", ">GUAR", ">BORROW", ">WEIGHT", ">USED", ">BORROWED", ">PEND", ">RUN", "FOR"],
        (
            [
                q.name,
                q.guaranteed_gpus,
                "any" if q.borrow_limit_gpus is None else q.borrow_limit_gpus,
                f"{q.weight:g}",
                q.gpus_in_use,
                q.gpus_borrowed,
                q.jobs_pending,
                q.jobs_holding_gpus,
                _members(q.members),
            ]
            for q in infos
        ),
    )


def _members(members: Sequence[str], shown: int = 3) -> str:
    if not members:
        return "all"
    more = f" +{len(members) - shown}" if len(members) > shown else ""
    return ",".join(members[:shown]) + more


@users_app.command("list")
def list_users(url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    with cli_shared.connect(url) as client:
        users = run(client.users)
    if as_json:
        echo_json(json.dumps([u.model_dump(mode="json") for u in users], indent=2))
        return
    cli_shared.print_table(
        ["USER", "ROLE", "SINCE"],
        ([u.name, u.role, f"{u.created_at:%Y-%m-%d %H:%M}"] for u in users),
    )


@users_app.command("create")
def create_user(
    name: str,
    role: Annotated[Literal["user", "admin"], typer.Option(help="admin: may change anything")] = (
        "user"
    ),
    key: Annotated[bool, typer.Option(help="also issue the user's first API key")] = True,
    url: Url = DEFAULT_URL,
) -> None:
    """Create a user, and (unless --no-key) their first API key, printed once."""
    with cli_shared.connect(url) as client:
        user = run(lambda: client.create_user(name, role=role))
        echo(f"created {user.name} ({user.role})")
        if key:
            issued = run(lambda: client.issue_key(name))
            echo(f"API key {issued.id}: {issued.secret}  (shown once; keep it secret)")


@users_app.command("key")
def issue_key(name: str, url: Url = DEFAULT_URL) -> None:
    """Issue another API key for a user (to rotate: issue, switch, revoke the old one)."""
    with cli_shared.connect(url) as client:
        issued = run(lambda: client.issue_key(name))
    echo(f"API key {issued.id}: {issued.secret}  (shown once; keep it secret)")


@users_app.command("keys")
def list_keys(name: str, url: Url = DEFAULT_URL, as_json: AsJson = False) -> None:
    """A user's keys: id, the secret's first characters, issued, revoked."""
    with cli_shared.connect(url) as client:
        keys = run(lambda: client.keys(name))
    if as_json:
        echo_json(json.dumps([k.model_dump(mode="json") for k in keys], indent=2))
        return
    for key in keys:
        _print_key(key)


@users_app.command("revoke")
def revoke_key(key_id: int, url: Url = DEFAULT_URL) -> None:
    """Revoke an API key at once."""
    with cli_shared.connect(url) as client:
        _print_key(run(lambda: client.revoke_key(key_id)))


def _print_key(key: ApiKeyInfo) -> None:
    state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "live"
    echo(f"{key.id:>5}  {key.prefix}...  {key.user:<20} {state}")


def whoami(url: Url = DEFAULT_URL) -> None:
    """Who the service takes you for (GANGWAY_API_KEY), and whether auth is on."""
    with cli_shared.connect(url) as client:
        me = run(client.whoami)
    auth = "auth on" if me.auth_enabled else "auth off: everyone is an admin"
    member = f"; member of {', '.join(me.queues)}" if me.queues else ""
    echo(f"{me.name} ({me.role}; {auth}{member})")


def calibrate(url: Url = DEFAULT_URL) -> None:
    """Queue calibration runs (admins): a few short built-in jobs that measure the common
    node type; estimates and `auto` use the step-time model they fit once three succeed."""
    with cli_shared.connect(url) as client:
        jobs = run(client.calibrate)
    for job in jobs:
        echo(f"{job.id:>6}  {job.name}")
    echo(f"{len(jobs)} calibration runs queued at the lowest priority (user {jobs[0].user})")
