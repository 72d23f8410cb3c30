"""The shared lock primitive: a second taker is refused with the holder's text, a wait gives up at its
deadline, release frees the lock for the next taker, and a holder that dies frees it (no stale lock)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import flock


def test_second_taker_is_refused_with_the_holders_text(tmp_path):
    path = str(tmp_path / "state" / "x.lock")  # the folder is created
    fd, holder = flock.try_lock(path)
    assert fd is not None and holder is None
    flock.write_holder(fd, "pid=1 run-a")
    fd2, holder2 = flock.try_lock(path)
    assert fd2 is None and holder2 == "pid=1 run-a"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    flock.release(fd, clear=True)
    assert open(path).read() == ""
    fd3, _ = flock.try_lock(path)
    assert fd3 is not None, "the lock was not released"
    flock.release(fd3)


def test_a_wait_gives_up_at_its_deadline_and_an_empty_holder_reads_as_unknown(tmp_path):
    path = str(tmp_path / "x.lock")
    fd, _ = flock.try_lock(path)
    t = time.monotonic()
    fd2, holder = flock.try_lock(path, wait_seconds=0.5)
    waited = time.monotonic() - t
    assert fd2 is None and holder == "?"
    assert 0.4 <= waited < 5, waited
    flock.release(fd)


def _holder(path: str, seconds: float, note_pid: bool = False) -> subprocess.Popen:
    """Another process that takes the lock on `path` (optionally writing pid=<its pid>), says "held" and
    keeps it for `seconds`."""
    child = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, time\n"
        f"fd = os.open({path!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        + ("os.pwrite(fd, b'pid=%d' % os.getpid(), 0)\n" if note_pid else "")
        + "print('held', flush=True)\n"
        f"time.sleep({seconds})\n")], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_wait_succeeds_once_the_holder_releases(tmp_path):
    path = str(tmp_path / "x.lock")
    child = _holder(path, 1.0)
    try:
        assert flock.try_lock(path)[0] is None
        fd, holder = flock.try_lock(path, wait_seconds=30)
        assert fd is not None and holder is None
        flock.release(fd)
    finally:
        child.wait(timeout=30)


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    path = str(tmp_path / "x.lock")
    child = _holder(path, 600, note_pid=True)
    try:
        fd, holder = flock.try_lock(path)
        assert fd is None and holder == f"pid={child.pid}"
    finally:
        child.kill()
        child.wait(timeout=30)
    fd, holder = flock.try_lock(path)
    assert fd is not None, f"a dead holder still blocks the lock ({holder})"
    flock.release(fd)


def test_the_probe_names_a_live_holder_and_none_once_it_is_killed_without_creating_or_keeping_the_lock(tmp_path):
    path = str(tmp_path / "x.lock")
    assert flock.holder(path) is None and not os.path.exists(path), "a probe created the lock file"
    child = _holder(path, 600, note_pid=True)
    try:
        assert flock.holder(path) == f"pid={child.pid}"
    finally:
        child.kill()
        child.wait(timeout=30)
    assert flock.holder(path) is None, "a killed holder still reads as holding the lock"
    fd, _ = flock.try_lock(path)
    assert fd is not None, "the probe kept the lock"
    assert flock.holder(path) == f"pid={child.pid}", "this process's own lock is a holder too (the text is stale)"
    flock.release(fd)


def test_a_writer_that_starts_while_the_lock_is_probed_still_takes_it(tmp_path):
    """The probe takes a shared lock for an instant; a writer taking the lock in that instant must not be refused
    as if a second writer held it (the watch probes every poll while the fetch starts)."""
    path = str(tmp_path / "x.lock")
    probe = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    import fcntl
    import threading

    fcntl.flock(probe, fcntl.LOCK_SH)  # an instant stretched to 0.3 s
    threading.Timer(0.3, lambda: fcntl.flock(probe, fcntl.LOCK_UN)).start()
    fd, who = flock.try_lock(path, wait_seconds=flock.PROBE_TOLERANCE)
    os.close(probe)
    assert fd is not None, f"refused while only probed ({who})"
    flock.release(fd)
