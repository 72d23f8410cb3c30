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
from ansible_collections.modelfleet.fleet.plugins.filter.job import job_failure


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
            assert "modelfleet.fleet.job_failure(" in fh.read(), f
