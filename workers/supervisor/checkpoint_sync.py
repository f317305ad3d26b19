"""The supervisor's side of checkpoints in storage named by a URL
(`workers.checkpoint_store`): the newest complete checkpoint down into the rank's
own directory before the program starts, each `step-*` directory the program finishes up.

The directory is the program's (an attacker's uid): files are read as
`workers.supervisor.outputs` reads outputs, by descriptor, links never followed, FIFOs
never waited on, each file no further than its size when opened. While the program runs,
a `step-<n>` directory is uploaded once the program has reported a checkpoint at n or
later (the built-in trainer and `ctx.checkpointer` report each save after it is whole);
once it has exited, every `step-*` directory it left is. Uploaded directories are removed
from the host; rank 0's supervisor then prunes the store to the job's `keep_last`. The
last upload is tried a few times before it is given up, saying so.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from workers.checkpoint_layout import PREFIX, step_of
from workers.checkpoint_store import JobCheckpointStore, RankOf
from workers.supervisor.outputs import regular_files

POLL_S = 5.0  # besides each reported checkpoint, how often the directory is looked at
FINAL_TRIES_S = (0.0, 5.0, 20.0)  # the waits before each try of the last upload


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
        self._reported = -1  # the newest checkpoint step the program reported
        self.finishing = False  # the program has ended; its last saves are uploading
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

    def notify(self, step: int) -> None:
        """The program reported a checkpoint at `step`: upload it now."""
        self._reported = max(self._reported, step)
        self._wake.set()

    def finish(self) -> None:
        """The program has ended: stop the thread and upload every step directory it
        left, trying again a few times; what still fails is said and left out."""
        self.finishing = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=POLL_S * 2)
        for wait_s in FINAL_TRIES_S:
            time.sleep(wait_s)
            self._failed.clear()  # each try says what failed
            self.upload_finished(final=True)
            if not self._finished_names(final=True):
                return
        left = ", ".join(self._finished_names(final=True))
        self._log(f"[gangway] checkpoint(s) {left} could not be uploaded: not in the store")

    def upload_finished(self, *, final: bool = False) -> None:
        """Upload the finished step directories not uploaded yet, oldest first."""
        with self._lock:
            for name in self._finished_names(final=final):
                if self._upload(name) and self._rank.rank == 0:
                    self._prune()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_S)
            self._wake.clear()
            if not self._stop.is_set():
                self.upload_finished()

    def _finished_names(self, *, final: bool = False) -> list[str]:
        """Step directories not uploaded yet that are whole: reported by the program, or
        any once it has ended."""
        try:
            names = [
                p.name
                for p in self._local.iterdir()
                if p.name.startswith(PREFIX) and p.is_dir() and not p.is_symlink()
            ]
        except OSError:
            return []
        finished = []
        for name in names:
            try:
                step = step_of(Path(name))
            except ValueError:
                continue
            whole = final or step <= self._reported
            if name == f"{PREFIX}{step:08d}" and name not in self._done and whole:
                finished.append((step, name))
        return [name for _, name in sorted(finished)]

    def _upload(self, name: str) -> bool:
        directory = self._local / name
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
