"""The fail message of an async job (filter `job_failure`, used by hf_fetch's two download watches): a module's own
reason is passed on; a job whose process was killed gets what happened and what to do instead of the async
wrapper's traceback. The killed job's result is produced by Ansible's own async wrapper running a real process that
is SIGKILLed, not written by hand, so a change of that result's shape in a new ansible-core fails here."""

from __future__ import annotations

import json
import os
import signal
import stat

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.modelfleet.fleet.plugins.filter.job import START_GRACE, job_failure, job_watch


class _Notifier:
    def send(self, _v):
        pass

    def close(self):
        pass


def _job_result(tmp_path, monkeypatch, script: str) -> dict:
    """What async_status reads for a job whose module is `script`, run by Ansible's async wrapper."""
    from ansible.modules import async_wrapper

    mod = tmp_path / "module.sh"
    mod.write_text(script)
    mod.chmod(mod.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(async_wrapper, "job_path", str(tmp_path / "job"))
    monkeypatch.setattr(async_wrapper, "ipc_notifier", _Notifier(), raising=False)
    async_wrapper._run_module(str(mod), "1.1")
    return json.loads((tmp_path / "job").read_text())


def test_a_killed_job_is_named_as_killed_with_what_to_do_and_no_traceback(tmp_path, monkeypatch):
    res = _job_result(tmp_path, monkeypatch, f"#!/bin/sh\necho 'fetching' >&2\nkill -{int(signal.SIGKILL)} $$\n")
    assert "Traceback" in res["msg"], res  # what the role's fail task used to print
    msg = job_failure(res, "hf_fetch (peer) on gpu-2")
    assert msg.startswith("hf_fetch (peer) on gpu-2: its process ended without an answer (killed")
    assert "nothing was marked complete" in msg and "rerun the play" in msg and "Traceback" not in msg
    assert msg.endswith("Its last error output: fetching")
    own = job_failure(res, "hf_fetch on gpu-1", "rerun the play: it keeps the files already downloaded")
    assert own.startswith("hf_fetch on gpu-1: its process") and "already downloaded" in own


def test_a_module_that_failed_keeps_its_own_reason(tmp_path, monkeypatch):
    answer = {"failed": True, "msg": "hf_peer_pull: no source left to pull f1 from (a: rsync failed)"}
    res = _job_result(tmp_path, monkeypatch, f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    assert job_failure(res, "hf_fetch (peer) on gpu-2") == f"hf_fetch (peer) on gpu-2: {answer['msg']}"
    assert job_failure({"finished": 1}, "hf_fetch on gpu-1") == "hf_fetch on gpu-1: the job failed and gave no reason"


def test_not_a_result_is_refused():
    with pytest.raises(AnsibleFilterError, match="async_status result"):
        job_failure("boom", "x")


def test_the_filter_is_what_the_roles_use():
    roles = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "hf_fetch", "tasks")
    for f in ("poll.yml", "peer_poll.yml"):
        with open(os.path.join(roles, f)) as fh:
            text = fh.read()
            assert "modelfleet.fleet.job_failure(" in text and "modelfleet.fleet.job_watch(" in text, f


def _polls(held_at: list[bool], step: float, grace: float, taken_at: float | None = None) -> list[dict]:
    """The watch's results over polls `step` seconds apart (the job started at 999 by the host's clock), with the
    lock held or free at each, last taken at `taken_at`."""
    w, out = {}, []
    for i, held in enumerate(held_at):
        w = job_watch(w, {"held": held, "taken_at": taken_at, "now": 1000.0 + i * step}, 999.0, grace,
                      "hf_fetch on gpu-1")
        out.append(w)
    return out


def test_a_writer_seen_then_gone_fails_the_watch_after_the_grace_with_what_happened():
    polls = _polls([True, True, False, False, False], step=1.0, grace=2.0)
    assert [p["gone"] for p in polls] == [False, False, False, False, True]
    msg = polls[-1]["message"]
    assert msg.startswith("hf_fetch on gpu-1: its process is gone - the job never finished")
    assert "write lock for 2 s" in msg and "nothing was marked complete" in msg and "rerun the play" in msg


def test_a_writer_that_is_back_resets_the_count():
    polls = _polls([True, False, True, False, False, False], step=1.0, grace=2.0)
    assert [p["gone"] for p in polls] == [False] * 5 + [True]
    assert polls[2]["free_since"] is None and polls[3]["free_since"] == 1003.0


def test_one_free_poll_is_never_enough_even_past_the_grace():
    """A job that ends between its status and the probe has its result written by the next poll."""
    polls = _polls([True, False], step=100.0, grace=2.0)
    assert not polls[-1]["gone"]


def test_a_writer_never_seen_may_still_be_starting_so_the_grace_is_at_least_the_start_grace():
    step = START_GRACE / 4
    polls = _polls([False] * 6, step=step, grace=2.0)
    assert [p["gone"] for p in polls] == [False] * 4 + [True, True]
    assert not _polls([False] * 3, step=1.0, grace=2.0)[-1]["seen_held"]
    long = _polls([False] * 3, step=100.0, grace=150.0)  # a grace longer than the start's is kept
    assert [p["gone"] for p in long] == [False, False, True]
    before = _polls([False] * 4, step=1.0, grace=2.0, taken_at=990.0)  # a lock taken by an earlier run
    assert not any(p["gone"] for p in before)


def test_a_writer_the_watch_never_saw_but_that_took_the_lock_after_the_start_needs_no_start_grace():
    """A short pull killed between two polls: the watch never saw it hold the lock, but the lock file says a writer
    took it after the job started (found on the emulated network: without this the play waited 60 s, not 15)."""
    polls = _polls([False, False, False, False], step=1.0, grace=2.0, taken_at=999.5)
    assert [p["gone"] for p in polls] == [False, False, True, True]


@pytest.mark.parametrize("watch,probe,needle", [
    (None, {"held": False, "taken_at": None, "now": 1.0}, "previous poll's result"),
    ({}, {"failed": True}, "fetch_watch's result"),
    ({}, {"held": False, "taken_at": None, "now": "soon"}, "numbers of seconds"),
])
def test_bad_input_is_named(watch, probe, needle):
    with pytest.raises(AnsibleFilterError, match=needle):
        job_watch(watch, probe, 0.0, 2.0, "x")
