"""The one advisory-lock primitive behind modelfleet's host locks (`disk.HostLock`, the storage plan and
deletions; `fetch.ModelWriteLock`, one writer per model): an exclusive, non-blocking flock on a file
that also records who holds it. The kernel drops a flock when its last descriptor closes, so a killed
holder never leaves a stale lock; only the holder text can be stale, and the callers say so."""

from __future__ import annotations

import fcntl
import os
import time


def try_lock(path: str, wait_seconds: float = 0.0, mode: int = 0o600):
    """Open (creating it and its folder) and lock `path`. Returns (fd, None) when the lock was taken, or
    (None, holder) when another process still held it after `wait_seconds`: `holder` is the text that
    process wrote ("?" if none). The descriptor is close-on-exec: a forked child shares the lock (the
    fetch's download child relies on that), a program it execs does not."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, None
        except BlockingIOError:
            if time.monotonic() >= deadline:
                who = _holder_text(fd)
                os.close(fd)
                return None, who
            time.sleep(0.2)


def _holder_text(fd: int) -> str:
    """What the lock's holder wrote in the file ("?" when nothing, or it cannot be read)."""
    try:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "?"
    except OSError:
        return "?"


def holder(path: str) -> str | None:
    """Who holds the lock on `path` now, without ever creating the file or keeping the lock: None when no process
    holds it (or there is no such file), else the holder's text ("?" if none). The probe takes a shared lock for an
    instant, so a writer starting at that instant must wait a moment (ModelWriteLock waits PROBE_TOLERANCE)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder_text(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# how long a taker of a lock that is probed (holder) retries: a probe holds it for well under a millisecond
PROBE_TOLERANCE = 2.0


def write_holder(fd: int, text: str) -> None:
    """Replace what the lock file says about its holder."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)


def release(fd: int, clear: bool = False) -> None:
    """Drop the lock (closing the descriptor releases it); `clear` empties the holder text first."""
    if clear:
        os.ftruncate(fd, 0)
    os.close(fd)
