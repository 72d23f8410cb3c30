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


# --------------------------------------------------------------------------- the job (what async_status would say)
def _async_status(job_path: str) -> dict:
    """The real ansible.builtin.async_status module's answer for the job file at `job_path`."""
    import subprocess
    import sys

    args = os.path.join(os.path.dirname(job_path), "args.json")
    with open(args, "w") as f:
        json.dump({"ANSIBLE_MODULE_ARGS": {"jid": os.path.basename(job_path),
                                           "_async_dir": os.path.dirname(job_path)}}, f)
    out = subprocess.run([sys.executable, "-m", "ansible.modules.async_status", args], capture_output=True, text=True,
                         check=False)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run_module(name: str, module_args: dict, tmp) -> dict:
    """This collection's module `name` run as Ansible runs it (python -m, its arguments in a file): its answer."""
    import subprocess
    import sys

    args = os.path.join(tmp, f"{name}-args.json")
    with open(args, "w") as f:
        json.dump({"ANSIBLE_MODULE_ARGS": module_args}, f)
    out = subprocess.run([sys.executable, "-m", f"ansible_collections.modelfleet.fleet.plugins.modules.{name}", args],
                         capture_output=True, text=True, check=False)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_job_reads_as_async_status_reads_it(tmp_path, monkeypatch):
    """One module per poll replaces fetch_watch + async_status: the job it reports must be what async_status said,
    for each state the async wrapper leaves its results file in (checked against the real async_status)."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch_watch import read_job

    from tests.unit.test_job_failure import _job_result

    def wrapped(sub, answer):  # the results file the async wrapper writes for a module that does `answer`
        os.makedirs(tmp_path / sub)
        return json.dumps(_job_result(tmp_path / sub, monkeypatch, f"#!/bin/sh\n{answer}\n"))

    job = str(tmp_path / "1.1")
    states = {
        "the wrapper's start record": json.dumps({"started": 1, "finished": 0, "ansible_job_id": "1.1"}),
        "nothing written yet": "",
        "a module that answered": wrapped("a", "echo '{\"pull\": {\"kept\": 3}}'"),
        "a module that failed": wrapped("b", "echo '{\"failed\": true, \"msg\": \"no source\"}'"),
        "a killed module": wrapped("c", "kill -9 $$"),
    }
    for what, text in states.items():
        with open(job, "w") as f:
            f.write(text)
        ours, theirs = read_job(job), _async_status(job)
        for k in ("finished", "failed", "msg", "pull", "cmd", "data"):
            assert ours.get(k) == theirs.get(k), (what, k, ours, theirs)
        assert ours["started"] is True  # async_status's action plugin says started in status mode, whatever the file
    os.unlink(job)
    ours, theirs = read_job(job), _async_status(job)
    assert ours["failed"] and theirs["failed"] and ours["finished"] and theirs["finished"]
    assert "could not find job" in ours["msg"] and "could not find job" in theirs["msg"]


def test_with_a_job_the_look_waits_for_the_job_to_finish_not_for_the_status(tmp_path):
    """A pull writes its last status before it answers: the look returns once the job's answer is there (so the
    same poll reports the figures), and no later than the interval while the job runs."""
    st, lk, job = str(tmp_path / "m.json"), str(tmp_path / "m.flock"), str(tmp_path / "1.1")
    _write(st, "receiving")
    with open(job, "w") as f:
        json.dump({"started": 1, "finished": 0}, f)
    t = time.monotonic()
    out = look(st, lk, 0.3, ["received", "failed"], interval=0.05, job_file=job)
    assert not out["job"]["finished"] and 0.3 <= time.monotonic() - t < 3

    def answer():
        with open(job + ".tmp", "w") as f:
            json.dump({"changed": True, "pull": {"kept": 0}}, f)
        os.replace(job + ".tmp", job)

    threading.Timer(0.2, _write, (st, "received")).start()
    threading.Timer(0.6, answer).start()
    t = time.monotonic()
    out = look(st, lk, 5.0, ["received", "failed"], interval=0.05, job_file=job)
    assert out["job"]["finished"] and out["job"]["pull"] == {"kept": 0} and out["ended"]
    assert 0.5 <= time.monotonic() - t < 3


# --------------------------------------------------------------------------- how long each look waits
def test_the_waits_grow_with_the_fetchs_time_so_a_long_transfer_sends_few_modules():
    """Each look is a module sent to each host (~180 KB over the controller's link) and a process there: the waits
    start at the first interval, then grow to half the time the fetch has run, up to the longest."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch_watch import grown_wait

    assert grown_wait(10, 60, 0) == 10 and grown_wait(10, 60, 19) == 10, "a young fetch is looked at often"
    assert grown_wait(10, 60, 50) == 25 and grown_wait(10, 60, 119) == 59.5
    assert grown_wait(10, 60, 4 * 3600) == 60, "never longer than the longest"
    assert grown_wait(10, 10, 4 * 3600) == 10 and grown_wait(10, 0, 4 * 3600) == 10, "no longest above: fixed"

    def looks(seconds, first, most):  # the looks of a watch over a transfer of `seconds`
        t = n = 0
        while t < seconds:
            t += grown_wait(first, most, t)
            n += 1
        return n

    assert looks(240, 10, 60) == 9 and looks(240, 10, 10) == 24, "4 minutes: 10, 10, 10, 15, 22, 34, 51, 60, 60 s"
    assert looks(4 * 3600, 10, 60) == 245 and looks(4 * 3600, 10, 10) == 1440, "4 hours: a sixth of the modules"
    assert looks(240, 2, 60) == 13 and looks(30, 2, 60) == 7, "a short first interval stays short while young"


def test_the_module_grows_its_wait_from_when_the_fetch_started(tmp_path):
    """The module shell: with `since` (the host's clock when the job started) the wait is grown; without, it is
    wait_seconds - run as Ansible runs it, the arguments in a file."""
    st, lk = str(tmp_path / "m.json"), str(tmp_path / "m.flock")
    _write(st, "downloading")
    now = time.time()
    for since, want in ((now - 1000, 0.6), (now + 60, 0.2), (None, 0.2)):  # started long ago, not yet, unknown
        args = {"status": st, "flock": lk, "wait_seconds": 0.2, "wait_max_seconds": 0.6}
        if since is not None:
            args["since"] = since
        out = _run_module("fetch_watch", args, tmp_path)
        assert out["wait_seconds"] == want and out["waited_seconds"] >= want, (since, out)
        assert not out["ended"] and out["status"]["state"] == "downloading"


def test_a_finished_jobs_results_file_is_removed_once_read_and_an_unfinished_ones_is_kept(tmp_path):
    """Each fetch is an async job whose results file (~/.ansible_async/<jid>) stayed behind on every host, one per
    fetch; the watch removes it once it has read the job's answer - never while the job runs, never in check mode."""
    st, lk, job = str(tmp_path / "m.json"), str(tmp_path / "m.flock"), str(tmp_path / "1.1")
    _write(st, "receiving")
    args = {"status": st, "flock": lk, "job_file": job, "remove_finished_job": True}
    with open(job, "w") as f:
        json.dump({"started": 1, "finished": 0, "ansible_job_id": "1.1"}, f)
    out = _run_module("fetch_watch", args, tmp_path)
    assert not out["job"]["finished"] and not out["changed"] and os.path.exists(job)
    with open(job, "w") as f:
        json.dump({"changed": True, "pull": {"kept": 2}}, f)
    out = _run_module("fetch_watch", {**args, "_ansible_check_mode": True}, tmp_path)
    assert out["job"]["pull"] == {"kept": 2} and not out["changed"] and os.path.exists(job), "check mode: nothing"
    out = _run_module("fetch_watch", {**args, "remove_finished_job": False}, tmp_path)
    assert not out["changed"] and os.path.exists(job), "only when asked"
    out = _run_module("fetch_watch", args, tmp_path)
    assert out["job"]["finished"] and out["job"]["pull"] == {"kept": 2}, "the answer is read before the file goes"
    assert out["changed"] and not os.path.exists(job)
