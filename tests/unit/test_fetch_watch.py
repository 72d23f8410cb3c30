"""One look of the fetch watch (module fetch_watch): it waits for the status to say the fetch ended (no longer than
its interval), reads it ({} when there is none or it is not JSON), and says whether a process holds the model's
write lock and when a writer last took it - with real files and a real holder in another process."""

from __future__ import annotations

import json
import os
import threading
import time

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch_watch import look

from tests.unit.test_flock import _holder


def _write(path, state):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"state": state, "bytes_done": 7}, f)
    os.replace(tmp, path)


def test_the_look_returns_when_the_status_says_the_fetch_ended_and_not_before(tmp_path):
    st, lk = str(tmp_path / "m.json"), str(tmp_path / "m.flock")
    _write(st, "receiving")
    threading.Timer(0.4, _write, (st, "received")).start()
    t = time.monotonic()
    out = look(st, lk, 5.0, ["received", "failed"], interval=0.05)
    took = time.monotonic() - t
    assert out["ended"] and out["status"]["state"] == "received"
    assert 0.3 <= took < 3, took
    assert not out["held"] and out["holder"] is None and out["taken_at"] is None, "no lock file: nobody, never taken"
    assert not os.path.exists(lk), "the look created the lock file"


def test_a_fetch_still_running_is_looked_at_for_the_interval_only(tmp_path):
    st, lk = str(tmp_path / "m.json"), str(tmp_path / "m.flock")
    _write(st, "downloading")
    t = time.monotonic()
    out = look(st, lk, 0.3, ["complete", "failed"], interval=0.05)
    assert not out["ended"] and out["status"] == {"state": "downloading", "bytes_done": 7}
    assert 0.3 <= time.monotonic() - t < 3 and out["waited_seconds"] >= 0.3


def test_no_status_or_one_that_is_not_a_json_object_reads_as_none_yet(tmp_path):
    st, lk = str(tmp_path / "m.json"), str(tmp_path / "m.flock")
    assert look(st, lk, 0, ["complete"])["status"] == {}
    for text in ("{half", "[1, 2]"):
        with open(st, "w") as f:
            f.write(text)
        assert look(st, lk, 0, ["complete"])["status"] == {}


def test_the_look_names_a_live_writer_and_when_it_took_the_lock(tmp_path):
    st, lk = str(tmp_path / "m.json"), str(tmp_path / "m.flock")
    before = look(st, lk, 0, ["complete"])["now"]
    child = _holder(lk, 600, note_pid=True)
    try:
        out = look(st, lk, 0, ["complete"])
        assert out["held"] and out["holder"] == f"pid={child.pid}"
        assert out["taken_at"] >= before - 0.05, "the lock was taken after the first look"  # coarse file clock
    finally:
        child.kill()
        child.wait(timeout=30)
    out = look(st, lk, 0, ["complete"])
    assert not out["held"] and out["taken_at"] is not None
