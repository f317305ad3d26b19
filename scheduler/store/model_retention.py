"""Retention of model versions, under the age the jobs' files have
(`GANGWAY_ARTIFACT_RETENTION_DAYS`): a version registered longer ago is deleted, rows
and files, unless someone still relies on it:

- an alias points at it (`production`, `staging`: what a team ships is named);
- it is its model's newest version (a model never empties by age alone);
- a job that has not ended starts from it (`init_from`), so a queued job never finds its
  weights gone at launch.

So a model's history of unnamed versions ages out as job outputs do, and what carries a
name or is in use stays as long as it does. The model's row stays too (its name and
numbers are never reused: `scheduler.store.registry`). Rows go first, then files: a
reader sees a version whole, or no version.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path

from gangway.states import JobState
from scheduler.model import ModelInit
from scheduler.store.artifact_retention import SweptFolders
from scheduler.store.model_files import remove_version, version_directory
from scheduler.store.records import JobRecord
from scheduler.store.registry import ModelNotFound, ModelRegistry

log = logging.getLogger("gangway")
UNFINISHED = [state for state in JobState if not state.is_terminal]


class ModelVersionSweeper:
    def __init__(
        self,
        registry: ModelRegistry,
        root: Path,
        unfinished_jobs: Callable[[], Iterable[JobRecord]],
        age: timedelta,
        clock: Callable[[], datetime],
    ) -> None:
        self._registry, self._root, self._jobs = registry, root, unfinished_jobs
        self._age, self._clock = age, clock

    def sweep(self) -> SweptFolders:
        """Delete the versions past the age that nothing relies on (see the module)."""
        pinned = pinned_versions(self._jobs())
        swept = SweptFolders()
        for version in self._registry.unnamed_versions(before=self._clock() - self._age):
            if (version.model, version.version) in pinned:
                continue
            try:
                self._registry.delete_version(version.model, version.version)
            except ModelNotFound:  # deleted through the API meanwhile
                continue
            folder = version_directory(self._root, version.model, version.version)
            remove_version(self._root, version.model, version.version)
            (swept.failed if folder.exists() else swept.removed).append(folder)
            log.info(
                "retention: deleted %s v%d (no alias, not the newest, unused)",
                version.model,
                version.version,
            )
        return swept


def pinned_versions(jobs: Iterable[JobRecord]) -> set[tuple[str, int]]:
    """The (model, version) pairs the jobs start from."""
    return {
        (job.spec.init_from.name, job.spec.init_from.version)
        for job in jobs
        if isinstance(job.spec.init_from, ModelInit)
    }
