"""Filter plugin: the reason an async job of a role failed, for its fail task (`job_failure`).

A module that fails answers with its own `msg`, which is passed on. A job whose process ended without answering
(killed by hand or by the out-of-memory killer, or crashed) gets Ansible's async wrapper's own result instead: the
command, its empty output and a traceback of the wrapper's JSON parsing ("No start of json char found"). That
traceback says nothing about the job; it is replaced by what happened and what to do."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def job_failure(result, what, rerun="rerun the play: it continues from the files already verified here"):
    """`result`: async_status's result for a finished job that did not give its figures; `what`: who failed (the
    task's subject, e.g. "hf_fetch on gpu-1"). Returns one line for ansible.builtin.fail."""
    if not isinstance(result, dict):
        raise AnsibleFilterError("job_failure: give it the async_status result of the finished job")
    # the async wrapper's result when the module answered no JSON (ansible/modules/async_wrapper.py _run_module):
    # "cmd" with "data" (or "outdata" when the module could not be started); a module's own failure has neither
    no_answer = "cmd" in result and ("data" in result or "outdata" in result)
    if not no_answer:
        return f"{what}: {result.get('msg') or 'the job failed and gave no reason'}"
    err = " ".join(str(result.get("stderr") or "").split())[-300:]
    return (f"{what}: its process ended without an answer (killed - by hand or by the out-of-memory killer - or "
            f"crashed); nothing was marked complete. Check the host's memory and journal, then {rerun}."
            + (f" Its last error output: {err}" if err else ""))


class FilterModule:
    def filters(self):
        return {"job_failure": job_failure}
