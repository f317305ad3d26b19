"""The supervisor's side of checkpoints in storage named by a URL
(`workers.checkpoint_store`): the newest complete checkpoint down into the rank's
own directory before the program starts, each `step-*` directory the program finishes up.

The directory is the program's (an attacker's uid): files are read as
`workers.supervisor.outputs` reads outputs, by descriptor, links never followed. A
directory counts as finished once it has its `step-<n>` name (the program writes a save
under another name and renames it, as `workers.engine.checkpoint` does). Uploaded
directories are removed from the host; rank 0's supervisor then prunes the store to the
job's `keep_last`.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from workers.checkpoint_layout import PREFIX, step_of
from workers.checkpoint_store import JobCheckpointStore, RankOf
from workers.supervisor.outputs import regular_files

POLL_S = 5.0  # besides each reported checkpoint, how often the directory is looked at


class CheckpointSync:
    def __init__(
        self,
        store: JobCheckpointStore,
        local: Path,
        rank: RankOf,
        keep_last: int,
        log: Callable[[str], None],
    ) -> None:
        self._store, self._local, self._rank = store, local, rank
        self._keep_last, self._log = keep_last, log
        self._done: set[str] = set()  # step directories uploaded (or restored)
        self._failed: set[str] = set()  # said once each
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def restore(self) -> int | None:
        """The newest complete checkpoint, copied into the local directory; its step.
        A store that cannot be read raises: starting from scratch instead would lose
        the job's work."""
        self._local.mkdir(parents=True, exist_ok=True)
        newest = self._store.newest()
        if newest is None:
            return None
        local = self._store.download(newest, self._local)
        self._done.add(local.name)
        self._log(
            f"[gangway] checkpoint at step {newest.step} fetched from {self._store.url} "
            f"({newest.bytes:,} bytes)"
        )
        return newest.step

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gangway-ckpt-sync", daemon=True)
        self._thread.start()

    def notify(self) -> None:
        """The program reported a new checkpoint: look now."""
        self._wake.set()

    def finish(self) -> None:
        """The program has ended: upload what it finished, once more, and stop."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self.upload_finished()

    def upload_finished(self) -> None:
        """Upload every finished step directory not uploaded yet, oldest first."""
        with self._lock:
            for name in self._finished_names():
                if self._upload(name) and self._rank.rank == 0:
                    self._prune()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_S)
            self._wake.clear()
            if not self._stop.is_set():
                self.upload_finished()

    def _finished_names(self) -> list[str]:
        try:
            names = [p.name for p in self._local.iterdir() if p.name.startswith(PREFIX)]
        except OSError:
            return []
        finished = []
        for name in names:
            try:
                step_of(Path(name))
            except ValueError:
                continue
            if name not in self._done:
                finished.append(name)
        return sorted(finished)

    def _upload(self, name: str) -> bool:
        directory = self._local / name
        if directory.is_symlink() or not directory.is_dir():
            return False
        try:
            copied = self._store.upload(name, _files(directory), self._rank)
        except Exception as exc:  # the store or the network: tried again next time
            if name not in self._failed:
                self._failed.add(name)
                self._log(f"[gangway] checkpoint {name} could not be uploaded (will retry): {exc}")
            return False
        self._done.add(name)
        shutil.rmtree(directory, ignore_errors=True)
        if self._rank.rank == 0:
            self._log(f"[gangway] checkpoint {name} uploaded ({copied:,} bytes from rank 0)")
        return True

    def _prune(self) -> None:
        try:
            self._store.prune(self._keep_last)
        except Exception as exc:
            self._log(f"[gangway] old checkpoints could not be pruned: {exc}")


def _files(directory: Path) -> Iterator[tuple[str, BinaryIO]]:
    """The regular files of a step directory, opened without following links; what is
    not a regular file is left out."""
    for relative, opened in regular_files(directory):
        if opened is None:
            continue
        with opened:
            yield relative.as_posix(), opened
