"""Retention of model versions, under the age the jobs' files have
(`GANGWAY_ARTIFACT_RETENTION_DAYS`): a version registered longer ago is deleted, rows
and files, unless someone still relies on it:

- an alias points at it (`production`, `staging`: what a team ships is named);
- it is its model's newest version (a model never empties by age alone);
- a job that has not ended starts from it (`init_from`), or a running sweep's trials
  will (its base's), so a queued job never finds its weights gone at launch.

So a model's history of unnamed versions ages out as job outputs do, and what carries a
name or is in use stays as long as it does. The model's row stays too (its name and
numbers are never reused: `scheduler.store.registry`). Rows go first, then files
(renamed out of the layout, then deleted; a folder that could not be deleted is found
by its new name and tried again next sweep): a reader sees a version whole, or none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

from gangway.states import JobState
from scheduler.model import UNFINISHED_STATES, ModelInit
from scheduler.store.artifact_retention import DELETING, SweptFolders, remove_folder
from scheduler.store.model_files import version_directory
from scheduler.store.records import JobRecord
from scheduler.store.registry import ModelNotFound, ModelRegistry
from scheduler.store.remote_models import RemoteModelFiles
from scheduler.store.sweeps import SweepRecord

log = logging.getLogger("gangway")


class Pins(Protocol):
    def in_states(self, states: Iterable[JobState]) -> list[JobRecord]: ...
    def running_sweeps(self) -> list[SweepRecord]: ...


class ModelVersionSweeper:
    def __init__(
        self,
        registry: ModelRegistry,
        root: Path,
        pins: Pins,
        age: timedelta,
        clock: Callable[[], datetime],
        *,
        store: RemoteModelFiles | None = None,
    ) -> None:
        self._registry, self._root, self._pins = registry, root, pins
        self._store = store  # the versions' files, when not in `root`
        self._age, self._clock = age, clock

    def sweep(self) -> SweptFolders:
        """Delete the versions past the age that nothing relies on (see the module). The
        candidates are listed before the pins are read, and each is deleted only if it
        still qualifies then (`delete_unnamed_version`), so a job stored or an alias set
        meanwhile keeps its version."""
        before = self._clock() - self._age
        candidates = self._registry.unnamed_versions(before=before)
        pinned = pinned_versions(self._pins) if candidates else set()
        swept = _leftovers(self._root)
        for version in candidates:
            name, number = version.model, version.version
            if (name, number) in pinned:
                continue
            try:
                if not self._registry.delete_unnamed_version(name, number, before=before):
                    continue
            except ModelNotFound:  # the model went meanwhile
                continue
            log.info("retention: deleted %s v%d (no alias, not the newest, unused)", name, number)
            if self._store is None:
                _remove(version_directory(self._root, name, number), swept)
            else:
                _remove_stored(self._store, name, number, swept)
        return swept


def pinned_versions(pins: Pins) -> set[tuple[str, int]]:
    """The (model, version) pairs that unfinished jobs, and the trials running sweeps
    will still make, start from."""
    found = {
        (job.spec.init_from.name, job.spec.init_from.version)
        for job in pins.in_states(UNFINISHED_STATES)
        if isinstance(job.spec.init_from, ModelInit)
    }
    for sweep in pins.running_sweeps():
        init = sweep.spec.get("base", {}).get("init_from")
        if isinstance(init, dict) and "model" in init:
            found.add((str(init["model"]), int(init["version"])))
    return found


def _leftovers(root: Path) -> SweptFolders:
    """Folders an earlier sweep renamed but could not delete (their rows are gone, so
    only their names find them)."""
    swept = SweptFolders()
    if root.is_dir():
        for folder in sorted(root.glob(f"*/{DELETING}v*")):
            _remove(folder.with_name(folder.name.removeprefix(DELETING)), swept)
    return swept


def _remove_stored(store: RemoteModelFiles, name: str, number: int, swept: SweptFolders) -> None:
    """Its files in the store; one that fails stays there, said in the log (the row is
    gone, and with it what would find them again)."""
    url = store.version_url(name, number)
    try:
        store.remove(name, number)
        swept.removed.append(url)
    except Exception:  # the store or the network
        log.exception("retention: could not delete %s from the store; it stays there", url)
        swept.failed.append(url)


def _remove(folder: Path, swept: SweptFolders) -> None:
    try:
        remove_folder(folder)
        swept.removed.append(folder)
    except OSError:
        log.exception("retention: could not delete %s; trying again next sweep", folder)
        swept.failed.append(folder)
