"""A virtualenv per user and requirement set on each node, for jobs that ship
requirements, built inside the sandbox as the job's identity.

`pip install` runs a package's build code, so it is the job's code: it runs sandboxed like
the program itself, with the network (to reach the index) and only the new virtualenv
writable. The virtualenv sees the training stack's packages after its own (a `.pth`
line adds them), as Ray's runtime_env pip did, so a job adds packages without installing
torch again. Keyed by user: a user's build can only ever affect that user's jobs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from workers.launch import INSIDE_RUN, INSIDE_TMP, INSIDE_WORK, SandboxIdentity
from workers.supervisor import sandbox
from workers.supervisor.output import LineBuffer
from workers.supervisor.process import ProgramProcess
from workers.supervisor.workspace import WorkspaceError, give_tree, locked

INSTALL_TIMEOUT_S = 1800.0
_COMPLETE = ".gangway-complete"


@dataclass(frozen=True)
class VenvBuild:
    """What a build needs: whose, which lines, the sandbox to run pip in, the job's
    working directory (requirement lines may name files in it), a folder of the rank's
    for the build's tmp, the trusted environment, and where pip's output goes."""

    user: str
    requirements: tuple[str, ...]
    support: sandbox.Support
    identity: SandboxIdentity | None
    work_dir: Path | None
    scratch: Path
    env: dict[str, str]
    logs: LineBuffer


def job_venv(base: Path, build: VenvBuild) -> Path:
    """The virtualenv for `build.requirements` on this node, built on first use."""
    key = hashlib.sha256(json.dumps([build.user, build.requirements]).encode()).hexdigest()
    venvs = base / "venvs"
    target = venvs / key[:32]
    with locked(venvs / f"{key[:32]}.lock"):
        if (target / _COMPLETE).is_file():
            return target
        shutil.rmtree(target, ignore_errors=True)
        _create(target)
        if build.identity is not None:
            give_tree(target, build.identity)
        _install(target, build)
        (target / _COMPLETE).touch()
    return target


def _create(target: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "venv", str(target)],
        check=True,
        capture_output=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    stack = sysconfig.get_paths()["purelib"]
    site = Path(sysconfig.get_paths(vars={"base": str(target)})["purelib"])
    (site / "_gangway_training_stack.pth").write_text(f"import site; site.addsitedir({stack!r})\n")


def _install(target: Path, build: VenvBuild) -> None:
    run, tmp = build.scratch / "pip-run", build.scratch / "pip-tmp"
    run.mkdir(mode=0o755, exist_ok=True)
    tmp.mkdir(mode=0o700, exist_ok=True)
    if build.identity is not None:
        os.chown(tmp, build.identity.uid, build.identity.gid)
    (run / "requirements.txt").write_text("\n".join(build.requirements) + "\n")
    inside = build.support.sandboxed
    mounts = [
        sandbox.Mount(target, str(target), writable=True),
        sandbox.Mount(run, INSIDE_RUN),
        sandbox.Mount(tmp, INSIDE_TMP, writable=True),
    ]
    home = INSIDE_TMP if inside else str(tmp)
    cwd = home
    if build.work_dir is not None:
        mounts.append(sandbox.Mount(build.work_dir, INSIDE_WORK))
        cwd = INSIDE_WORK if inside else str(build.work_dir)
    argv = [str(target / "bin" / "python"), "-m", "pip", "install", "--no-input"]
    argv += ["--disable-pip-version-check", "--no-warn-script-location"]
    argv += ["-r", f"{INSIDE_RUN if inside else run}/requirements.txt"]
    build.logs.append(f"[gangway] installing requirements: {' '.join(build.requirements)}")
    process = ProgramProcess(
        argv,
        support=build.support,
        mounts=mounts,
        cwd=cwd,
        identity=build.identity or SandboxIdentity(uid=os.getuid(), gid=os.getgid()),
        env={**build.env, "HOME": home, "TMPDIR": home, "PIP_NO_CACHE_DIR": "1"},
        logs=build.logs,
    )
    try:
        code = process.wait(INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        raise WorkspaceError(
            f"the job's requirements were not installed within {INSTALL_TIMEOUT_S:.0f} s"
        ) from None
    if code != 0:
        last = "\n".join(build.logs.tail(15))
        raise WorkspaceError(
            f"the job's requirements could not be installed (pip exited with code {code}); "
            f"its last output:\n{last}"
        )
