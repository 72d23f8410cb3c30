"""One writer per model: the fetch lock refuses a second writer with the holder's pid and progress,
changes nothing when it refuses, and is gone when its holder dies (no stale lock after a kill); a
download child whose watchdog is already dead ends instead of writing on as an orphan."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import (
    FetchError,
    ModelWriteLock,
    _die_with_parent,
    model_paths,
)

COMMIT = "57acd6fa976d1848528c6ee94458c99f479b17bf"


@pytest.fixture
def paths(tmp_path):
    return model_paths(str(tmp_path / "models"), "org/tiny", COMMIT)


def test_second_writer_is_refused_with_the_holders_pid_and_progress(paths):
    os.makedirs(os.path.dirname(paths["status"]), exist_ok=True)
    with open(paths["status"], "w") as f:
        json.dump({"state": "downloading", "percent": 41.25}, f)
    with ModelWriteLock(paths):
        assert open(paths["flock"]).read().strip() == str(os.getpid())
        with pytest.raises(FetchError) as e:
            ModelWriteLock(paths).acquire()
        msg = str(e.value)
        assert f"another fetch (pid {os.getpid()})" in msg
        assert "downloading, 41.2%" in msg and paths["status"] in msg and "nothing was changed" in msg
        assert open(paths["flock"]).read().strip() == str(os.getpid()), "the refused writer touched the lock"
    with ModelWriteLock(paths):  # released on exit
        pass


def test_refusal_without_a_status_file_still_names_the_holder(paths):
    with ModelWriteLock(paths):
        with pytest.raises(FetchError, match=r"pid \d+\) is writing .*no progress recorded"):
            ModelWriteLock(paths).acquire()


def test_a_killed_holder_leaves_no_stale_lock(paths):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the holder: takes the lock, says so, waits to be killed
        try:
            os.close(r)
            ModelWriteLock(paths).acquire()
            os.write(w, b"x")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"x"
    with pytest.raises(FetchError, match=f"pid {pid}"):
        ModelWriteLock(paths).acquire()
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    with ModelWriteLock(paths):
        assert open(paths["flock"]).read().strip() == str(os.getpid())


def test_a_forked_child_keeps_the_lock_while_it_lives(paths):
    """The download child inherits the lock: it stays held until the child is gone too."""
    held = ModelWriteLock(paths).acquire()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)  # lives until the parent has been refused (a taker waits up to flock.PROBE_TOLERANCE)
        os._exit(0)
    os.close(r)
    held.__exit__(None, None, None)  # the parent lets go; the child still holds the descriptor
    try:
        with pytest.raises(FetchError):
            ModelWriteLock(paths).acquire()
    finally:
        os.close(w)
        os.waitpid(pid, 0)
    with ModelWriteLock(paths):
        pass


def test_refusal_says_when_the_recorded_holder_is_gone(paths):
    """The module died but its download child lives on with the lock: the message says so."""
    held = ModelWriteLock(paths).acquire()
    with open(paths["flock"], "w") as f:
        f.write("999999999\n")  # no such process
    try:
        with pytest.raises(FetchError, match=r"pid 999999999, now gone: a process it started still holds"):
            ModelWriteLock(paths).acquire()
    finally:
        held.__exit__(None, None, None)


def _grandchild_outcome(watchdog_dies_first: bool) -> bytes:
    """Fork a 'watchdog' that forks a 'download' child; what the download child reports, if anything."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            watchdog = os.getpid()
            g = os.fork()
            if g == 0:
                try:
                    if watchdog_dies_first:
                        while os.getppid() == watchdog:
                            time.sleep(0.01)
                    _die_with_parent(watchdog)
                    os.write(w, b"still running")
                finally:
                    os._exit(0)
            if not watchdog_dies_first:
                os.waitpid(g, 0)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    chunks = []
    while chunk := os.read(r, 64):  # EOF once the download child is gone
        chunks.append(chunk)
    os.close(r)
    return b"".join(chunks)


def test_download_child_of_a_dead_watchdog_ends_at_once():
    assert _grandchild_outcome(watchdog_dies_first=True) == b""


def test_download_child_of_a_live_watchdog_runs():
    assert _grandchild_outcome(watchdog_dies_first=False) == b"still running"
