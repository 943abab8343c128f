"""A training run's out_dir: claimed before step 1, and a checkpoint in it that is always a good one.

`RunDir` is claimed before any training: out_dir is created (or the reason it cannot be is the error), a
lock file naming the holder (pid, host) keeps a second run out, a checkpoint already there is replaced only
with `--resume` or `--overwrite`, temporary files left by a killed save are removed, and the disk must have
room for two checkpoints (a save writes the new one before it removes the old).

`Keeper` decides what is written. A checkpoint's weights are judged by a loss computed on them: the next
step's training loss (its forward pass uses exactly those weights), or the validation loss evaluated at that
step (at the last step, the only one). Until then the state waits in memory. A finite loss within
`DIVERGENCE` times the best of its kind so far is written; a diverging one is dropped, so the file on disk
stays the last good model. A first validation loss has nothing of its kind to compare with, so a training
loss measured on the same weights judges them. A failed write keeps the state in memory and is tried again at
the next checkpoint; at the end (or on Ctrl-C) it goes to a fallback path that the error names, so trained
weights are never lost silently.
"""
from __future__ import annotations

import copy
import json
import math
import os
import shutil
import socket
import tempfile
import time
import warnings
from pathlib import Path

from tinynn import checkpoint
from tinynn.errors import TinynnError, TinynnNotice

LOCK_NAME = "tinynn.lock"
EMPTY_LOCK_AGE_S = 60.0  # an empty lock this old is abandoned: see _abandoned_empty
DIVERGENCE = 2.0  # a loss above twice the best so far means the run is diverging: keep the older checkpoint


class RunDir:
    def __init__(self, out_dir: str, checkpoint_name: str):
        self.dir = Path(out_dir)
        self.checkpoint = self.dir / checkpoint_name
        self.lock = self.dir / LOCK_NAME
        self._locked = False

    def claim(self, *, resume: bool, overwrite: bool) -> None:
        """Create out_dir, take its lock, refuse to replace a checkpoint by accident, remove orphans."""
        if self.dir.exists() and not self.dir.is_dir():
            raise TinynnError(f"out_dir {str(self.dir)!r} is a file, not a folder")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TinynnError(f"out_dir {str(self.dir)!r} cannot be created ({e.strerror or e})") from None
        if self.checkpoint.exists() and not self.checkpoint.is_file():
            raise TinynnError(f"{self.checkpoint} is not a file: move it away or choose another out_dir")
        self._take_lock()
        if self.checkpoint.exists() and not (resume or overwrite):
            self.release()
            raise TinynnError(f"{self.checkpoint} already holds a checkpoint: use --resume to continue it, "
                              "--overwrite to replace it, or another out_dir")
        for orphan in checkpoint.remove_orphans(self.checkpoint):
            warnings.warn(f"removed {orphan.name}, left in {self.dir} by a save that was interrupted", TinynnNotice)

    def check_disk(self, needed: int) -> None:
        """Two checkpoints of `needed` bytes must fit: a save writes the new one beside the one before, then
        renames it over that one. A checkpoint already in out_dir (resumed or overwritten) holds its share."""
        replaced = self.checkpoint.stat().st_size if self.checkpoint.is_file() else 0
        free = shutil.disk_usage(self.dir).free
        if free + replaced < 2 * needed:
            raise TinynnError(f"out_dir {str(self.dir)!r} has {free / 2**20:,.1f} MiB free; a checkpoint needs "
                              f"{needed / 2**20:,.1f} MiB, and a save writes the new one beside the one before "
                              f"(room for two: {2 * needed / 2**20:,.1f} MiB"
                              + (f", the {replaced / 2**20:,.1f} MiB of {self.checkpoint.name} included)"
                                 if replaced else ")"))

    def _take_lock(self) -> None:
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(2):
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                other = _read_lock(self.lock)
                if other is None and _abandoned_empty(self.lock):
                    warnings.warn(f"taking over {self.lock}, an empty lock left by a run that could not write it",
                                  TinynnNotice)
                    self.lock.unlink(missing_ok=True)
                    continue
                if not _is_stale(other):
                    who = f"process {other['pid']} on {other['host']}, since {other['started']}" if other else \
                        "an unreadable lock"
                    raise TinynnError(f"out_dir {str(self.dir)!r} is in use by another run ({who}); wait for it or "
                                      f"use another out_dir (delete {self.lock} if that run is gone)") from None
                warnings.warn(f"taking over the lock of process {other['pid']}, which has exited", TinynnNotice)
                self.lock.unlink(missing_ok=True)
                continue
            except OSError as e:
                raise TinynnError(f"out_dir {str(self.dir)!r} is not writable ({e.strerror or e})") from None
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(holder, f)
            except OSError as e:  # a full disk: an empty lock left behind would refuse every later run
                self.lock.unlink(missing_ok=True)
                raise TinynnError(f"out_dir {str(self.dir)!r}: cannot write its lock {self.lock.name} "
                                  f"({e.strerror or e})") from None
            self._locked = True
            return
        raise TinynnError(f"out_dir {str(self.dir)!r}: another run took the lock {self.lock} at the same time")

    def release(self) -> None:
        holder = _read_lock(self.lock) if self._locked else None
        if holder and holder["pid"] == os.getpid():
            self.lock.unlink(missing_ok=True)
        self._locked = False


def _read_lock(path: Path) -> dict | None:
    try:
        holder = json.loads(path.read_text())
        return holder if {"pid", "host", "started"} <= set(holder) else None
    except (OSError, ValueError, TypeError):
        return None


def _abandoned_empty(path: Path) -> bool:
    """An empty lock file older than EMPTY_LOCK_AGE_S: its run was killed, or found the disk full, between
    creating it and writing its holder (microseconds apart), so no run holds it."""
    try:
        info = path.stat()
    except OSError:
        return False
    return info.st_size == 0 and time.time() - info.st_mtime > EMPTY_LOCK_AGE_S


def _is_stale(holder: dict | None) -> bool:
    """A lock is stale when its process is gone; only a process on this host can be checked."""
    if holder is None or holder["host"] != socket.gethostname():
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


class Keeper:
    """Writes a checkpoint only once a loss measured on its weights says they are good (see the module)."""

    def __init__(self, path: Path, history: dict, saved_step: int | None):
        self.path = path
        self.best = {kind: min((v for v in history[f"{kind}_loss"] if math.isfinite(v)), default=math.inf)
                     for kind in ("train", "val")}
        self.pending = None  # the state offered at a checkpoint step, waiting for its loss
        self.unwritten = None  # a good state whose write failed: retried at the next checkpoint, then rescued
        self.saved_step = saved_step  # the step of the checkpoint on disk (a resumed one, or this run's)

    def offer(self, state: dict) -> None:
        """A checkpoint step: hold a copy of the state (`checkpoint.save`'s arguments) until it is judged."""
        self.pending = copy.deepcopy(state)

    @property
    def wants_train_loss(self) -> bool:
        """Whether the next validation loss judges a state with no earlier validation loss to compare with: a
        training loss measured on the same weights must judge it instead (see `judge`)."""
        return self.pending is not None and not math.isfinite(self.best["val"])

    def judge(self, loss: float, kind: str, train_loss: float | None = None) -> None:
        """`loss` was computed on the weights last offered (kind "train": the next step's; "val": evaluated).
        A first validation loss has no earlier one to compare with, and an overfit model's lies far above its
        training losses with nothing diverging: `train_loss`, a training loss measured on the same weights,
        then judges them against the training losses."""
        judged, against = loss, kind
        if kind == "val" and not math.isfinite(self.best["val"]) and train_loss is not None:
            judged, against = train_loss, "train"
        best = self.best[against]
        good = math.isfinite(judged) and judged <= DIVERGENCE * best
        if math.isfinite(loss):
            self.best[kind] = min(self.best[kind], loss)
        if self.pending is None:
            return
        state, self.pending = self.pending, None
        if good:
            self._write(state)
        elif math.isfinite(judged):  # a non-finite loss stops the run with its own error
            kept = f"step {self.saved_step}'s checkpoint is kept" if self.saved_step else "none is saved yet"
            warnings.warn(f"step {state['step']} not saved: its {against} loss {judged:.4g} is not within "
                          f"{DIVERGENCE:g}x the best ({best:.4g}); {kept}", TinynnNotice)

    def _write(self, state: dict) -> None:
        try:
            checkpoint.save(self.path, **state)
        except checkpoint.SaveError as e:
            self.unwritten = state
            warnings.warn(f"{e}; training goes on, keeping step {state['step']}'s state in memory to write at the "
                          "next checkpoint or at the end", TinynnNotice)
            return
        self.unwritten, self.saved_step = None, state["step"]

    def finish(self) -> Path | None:
        """The checkpoint's path once the last good state is on disk; a state that cannot be written to
        out_dir goes to a fallback path, and the error says where."""
        if self.unwritten is None:
            return self.path if self.saved_step else None
        state = self.unwritten
        try:
            checkpoint.save(self.path, **state)
            return self.path
        except checkpoint.SaveError as e:
            reason = str(e)
        rescue = Path(tempfile.gettempdir()) / f"tinynn-rescue-{os.getpid()}" / self.path.name
        try:
            checkpoint.save(rescue, **state)
        except checkpoint.SaveError as e2:
            raise TinynnError(f"{reason}, nor to {rescue} ({e2}): step {state['step']}'s weights are lost") from None
        raise TinynnError(f"{reason}; step {state['step']}'s checkpoint was saved to {rescue} instead")
