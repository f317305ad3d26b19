"""The directories a rank's supervisor prepares on its node before the program starts.

Per node (`node_directory`): unpacked working directories, one per package and shared
by every job that ships it (content-addressed, read-only to the programs), and the
virtualenvs built for jobs' requirements, one per user and requirement set. Per rank: a
run folder (the launch file), a private tmp and an outputs folder; per job and node: a
shared-memory folder its local ranks share (NCCL's transport), no other job's.

A shipped zip is the job's (an attacker's) bytes: it is unpacked here with the sizes
counted as they are written, not as the zip declares them, with its file count bounded,
and with no entry that is absolute, climbs out with `..`, or is a link.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from workers.launch import INSIDE_INPUTS, JobLaunch, RankInfo, RankLimits, SandboxIdentity
from workers.supervisor import sandbox

NODE_DIR_ENV = "GANGWAY_NODE_DIR"
_CHUNK = 1 << 20


class WorkspaceError(RuntimeError):
    """The rank's directories could not be prepared; the message says why, to the user."""


def node_directory() -> Path:
    """Where this node keeps Gangway's per-node files: `GANGWAY_NODE_DIR`, else a
    `gangway` folder in the Ray session's directory (its own on every node)."""
    configured = os.environ.get(NODE_DIR_ENV)
    if configured:
        return Path(configured)
    import ray

    node = ray._private.worker.global_worker.node
    return Path(node.get_session_dir_path()) / "gangway"


@dataclass(frozen=True)
class RankDirs:
    """A rank's own folders on its node."""

    root: Path

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"


def rank_dirs(
    base: Path, launch: JobLaunch, info: RankInfo, identity: SandboxIdentity | None
) -> RankDirs:
    """Fresh folders for this attempt's rank; folders an earlier attempt of the job left
    behind (a supervisor killed before it cleaned up) are removed first."""
    ranks = base / "ranks"
    ranks.mkdir(parents=True, exist_ok=True)
    prefix = f"job{launch.job_id}-"
    for stale in ranks.glob(f"{prefix}a*"):
        if not stale.name.startswith(f"{prefix}a{launch.attempt}-"):
            shutil.rmtree(stale, ignore_errors=True)
    dirs = RankDirs(ranks / f"{prefix}a{launch.attempt}-r{info.rank}")
    shutil.rmtree(dirs.root, ignore_errors=True)
    for path in (dirs.root, dirs.run):
        path.mkdir(mode=0o755, parents=True)
    for path in (dirs.tmp, dirs.outputs):
        private_dir(path, identity)
    return dirs


def shared_memory_dir(base: Path, launch: JobLaunch, identity: SandboxIdentity | None) -> Path:
    """The job's /dev/shm on this node, shared by its local ranks and by nobody else."""
    path = base / "shm" / f"job{launch.job_id}-a{launch.attempt}"
    private_dir(path, identity, exist_ok=True)
    return path


def private_dir(path: Path, identity: SandboxIdentity | None, *, exist_ok: bool = False) -> None:
    """A folder only the program's identity (or, unsandboxed, this process) may use."""
    path.mkdir(mode=0o700, parents=True, exist_ok=exist_ok)
    if identity is not None:
        os.chown(path, identity.uid, identity.gid)


def give_tree(path: Path, identity: SandboxIdentity) -> None:
    """Hand a folder the program writes (the job's checkpoints) to its identity, with
    what is already in it: an earlier attempt may have run as another uid."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for folder, dirs, files in os.walk(path):
        for name in (folder, *(os.path.join(folder, n) for n in (*dirs, *files))):
            with contextlib.suppress(FileNotFoundError):
                os.chown(name, identity.uid, identity.gid, follow_symlinks=False)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created), across the processes of this node."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def unpacked_package(
    base: Path, sha256: str, fetch: Callable[[], bytes], limits: RankLimits
) -> Path:
    """The package's files, unpacked once per node into a read-only folder named by its
    hash; `fetch` (the zip's bytes) is called only where they are not unpacked yet.
    Raises WorkspaceError for a zip that cannot be fetched, is not the one named, or is
    over a limit."""
    packages = base / "packages"
    target = packages / sha256
    with locked(packages / f"{sha256}.lock"):
        if target.is_dir():
            return target
        zip_path = packages / f".{sha256}.zip"
        partial = packages / f".{sha256}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            zip_path.write_bytes(fetch())
            if _sha256(zip_path) != sha256:
                raise WorkspaceError(f"the shipped package {sha256} does not hash to its name")
            _extract(zip_path, partial, limits)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        finally:
            zip_path.unlink(missing_ok=True)
        partial.rename(target)
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _extract(zip_path: Path, target: Path, limits: RankLimits) -> None:
    try:
        archive = zipfile.ZipFile(zip_path)
    except zipfile.BadZipFile as exc:
        raise WorkspaceError(f"the working directory's package is not a zip: {exc}") from exc
    with archive:
        entries = archive.infolist()
        if len(entries) > limits.unpacked_files:
            raise WorkspaceError(
                f"the working directory holds {len(entries)} entries, over the limit of "
                f"{limits.unpacked_files} (GANGWAY_PACKAGE_MAX_FILES)"
            )
        strip = _single_top_folder(entries)
        target.mkdir(mode=0o755, parents=True)
        budget = _Budget(limits.unpacked_bytes)
        for entry in entries:
            relative = _safe_relative(entry, strip)
            if relative is None:
                continue
            _extract_entry(archive, entry, target / relative, budget)


def _single_top_folder(entries: list[zipfile.ZipInfo]) -> str | None:
    """The one folder every entry sits under (the client's packer puts everything under
    one), stripped when unpacking, as Ray did."""
    tops = {PurePosixPath(e.filename).parts[0] for e in entries if e.filename.strip("/")}
    if len(tops) == 1:
        (top,) = tops
        if all(e.filename != top for e in entries):
            return top
    return None


def _safe_relative(entry: zipfile.ZipInfo, strip: str | None) -> PurePosixPath | None:
    """The entry's path under the target; WorkspaceError for one that would land outside
    it or is a link; None for the stripped top folder itself."""
    name = entry.filename.replace("\\", "/")
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\x00" in name:
        raise WorkspaceError(f"the working directory's package holds an unsafe path {name!r}")
    mode = entry.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise WorkspaceError(f"the working directory's package holds a link {name!r}")
    parts = path.parts[1:] if strip is not None else path.parts
    return PurePosixPath(*parts) if parts else None


@dataclass
class _Budget:
    left: int

    def spend(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise WorkspaceError(
                "the working directory unpacks to more than the limit "
                "(GANGWAY_PACKAGE_MAX_UNPACKED_BYTES)"
            )


def _extract_entry(
    archive: zipfile.ZipFile, entry: zipfile.ZipInfo, path: Path, budget: _Budget
) -> None:
    if entry.is_dir():
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
        return
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    executable = bool((entry.external_attr >> 16) & 0o111)
    with archive.open(entry) as source, path.open("wb") as sink:
        while chunk := source.read(_CHUNK):
            budget.spend(len(chunk))
            sink.write(chunk)
    path.chmod(0o755 if executable else 0o644)


def input_mounts(folder: Path, inputs: dict[str, str], sandboxed: bool) -> list[sandbox.Mount]:
    """INPUTS_DIR: a folder holding one entry per job read (`inputs_from`), each that
    job's outputs, read-only: in the sandbox a mount over an empty folder of that name,
    unsandboxed a link to it. A job that wrote no outputs has an empty folder."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    mounts = [sandbox.Mount(folder, INSIDE_INPUTS)] if sandboxed else []
    for name, host in sorted(inputs.items()):
        entry, source = folder / name, Path(host)
        if sandboxed or not source.is_dir():
            entry.mkdir(mode=0o755, exist_ok=True)
        elif not entry.is_symlink():
            entry.symlink_to(source, target_is_directory=True)
        if sandboxed and source.is_dir():
            mounts.append(sandbox.Mount(source, f"{INSIDE_INPUTS}/{name}"))
    return mounts
