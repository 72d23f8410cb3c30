"""Filter plugins for the watch of a role's detached (async) job: the reason it failed, for its fail task
(`job_failure`), and whether its process is gone while the job never finished (`job_watch`).

A module that fails answers with its own `msg`, which is passed on. A job whose process ended without answering
(killed by hand or by the out-of-memory killer, or crashed) gets Ansible's async wrapper's own result instead: the
command, its empty output and a traceback of the wrapper's JSON parsing ("No start of json char found"). That
traceback says nothing about the job; it is replaced by what happened and what to do.

A job whose process was killed together with the async wrapper (one `pkill -f` matches both), by the out-of-memory
killer taking the process group, or by a host restart, never finishes: async_status says "not finished" until the
job's timeout (24 hours by default for a fetch). The watch then asks whether the job's writer still holds the
model's write lock (module fetch_watch: the kernel frees it when that process ends, however it ends) and
fails once it has been free long enough."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

RERUN = "rerun the play: it continues from the files already verified here"
# A writer not seen yet may still be starting (the module's start and imports on a loaded host): before the watch
# has seen the lock held once, it waits at least this long
START_GRACE = 60.0


def job_failure(result, what, rerun=RERUN):
    """`result`: async_status's result (or fetch_watch's `job`, the same) for a finished job that did not give its
    figures; `what`: who failed (the task's subject, e.g. "hf_fetch on gpu-1"). Returns one line for
    ansible.builtin.fail."""
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


def job_watch(watch, probe, started_at, grace, what, rerun=RERUN):
    """One poll of an unfinished job's watch. `watch`: this filter's result at the previous poll ({} at the first);
    `probe`: module fetch_watch's result now (`held`, `taken_at`, `now`: the host's clock); `started_at`: its
    `now` from a probe just before the job was started; `grace`: how long the lock may stay free while the job has
    not finished (the role's stall seconds). A writer is known to have started once the watch saw the lock held or
    the lock was taken after `started_at` (a writer the watch never saw, as a short pull killed between two polls);
    until then the grace is at least START_GRACE (a module may still be starting). Returns the next `watch`:
    `gone` (fail with `message`), `free_since`, `seen_held`. Gone takes two polls that found the lock free: a job
    that ends between its status and the probe has written its result by the next poll."""
    if not isinstance(watch, dict) or not isinstance(probe, dict) or "held" not in probe:
        raise AnsibleFilterError("job_watch: give it the previous poll's result ({} at the first poll) and "
                                 "fetch_watch's result")
    try:
        now, grace, started_at = float(probe.get("now")), float(grace), float(started_at)
        taken = probe.get("taken_at") is not None and float(probe["taken_at"]) >= started_at
    except (TypeError, ValueError):
        raise AnsibleFilterError(f"job_watch: the probe's now {probe.get('now')!r} and taken_at "
                                 f"{probe.get('taken_at')!r}, started_at {started_at!r} and grace {grace!r} must be "
                                 "numbers of seconds") from None
    if probe["held"]:
        return {"seen_held": True, "free_since": None, "free_polls": 0, "gone": False, "message": ""}
    seen = bool(watch.get("seen_held")) or taken
    since = watch.get("free_since")
    since = now if since is None else float(since)
    polls = int(watch.get("free_polls") or 0) + 1
    need = grace if seen else max(grace, START_GRACE)
    gone = polls >= 2 and now - since >= need
    message = (f"{what}: its process is gone - the job never finished, and no process has held the model's write "
               f"lock for {now - since:.0f} s (killed together with Ansible's async wrapper, by the out-of-memory "
               f"killer, or the host restarted); nothing was marked complete. Check the host's memory and journal, "
               f"then {rerun}.") if gone else ""
    return {"seen_held": seen, "free_since": since, "free_polls": polls, "gone": gone, "message": message}


class FilterModule:
    def filters(self):
        return {"job_failure": job_failure, "job_watch": job_watch}
