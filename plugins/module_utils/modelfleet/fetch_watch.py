"""One look of a role's watch at a detached fetch (a hub download or a peer pull): its status file, waited on
until it says the fetch ended or the poll interval is up, whether a process still holds the model's write lock,
and what Ansible's async job says (the results file the async wrapper writes: what async_status reads). One
module call per poll instead of four (wait, read, probe, async_status): every module Ansible sends is ~180 KB,
and the watch sends them per host per poll for as long as the transfer takes (docs/fetch.md)."""

from __future__ import annotations

import json
import os
import time

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.flock import holder
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.poll import poll_until


def read_status(path: str) -> dict:
    """The status file as a dict; {} when there is none yet or it is not a JSON object (never an error: the watch
    prints what it has)."""
    try:
        with open(path) as f:
            st = json.load(f)
    except (OSError, ValueError):
        return {}
    return st if isinstance(st, dict) else {}


def read_job(path: str) -> dict:
    """What async_status says of the async job whose results file is `path` (ansible.builtin.async_status, the
    same rules): the module's answer with finished true once the job ended; {started, finished: false} while the
    file holds the wrapper's start record, or nothing parsable yet (the wrapper replaces it whole); a failure
    naming the file when there is none."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return {"failed": True, "started": True, "finished": True, "results_file": path,
                "msg": f"could not find job: no results file {path} (removed, or the job ran as another user)"}
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return {"started": True, "finished": False, "results_file": path}
    if "started" not in data:
        data["finished"] = True
    elif "finished" not in data:
        data["finished"] = False
    data["started"], data["finished"] = bool(data.get("started", True)), bool(data["finished"])
    return data


def grown_wait(first: float, most: float, elapsed: float) -> float:
    """How long one look waits: `first` while the fetch is young, then half the time it has run so far (`elapsed`),
    at most `most`. A long transfer's progress lines thin out: each look is a module Ansible sends (~180 KB over the
    controller's link) and a Python process on the host, per host, for as long as the transfer takes; the waits
    grow so that their number grows with the logarithm of the transfer's time, then by one per `most` seconds. A
    look still ends when the job finishes. `most` at or below `first` keeps every wait at `first`."""
    if most <= first:
        return first
    return max(first, min(most, elapsed / 2.0))


def remove_finished(job_file: str, job: dict) -> bool:
    """Remove the async job's results file once the job has finished and its answer has been read (`job`: read_job's
    answer), as async_status's cleanup mode does: a fetch leaves nothing behind in the connecting user's
    ~/.ansible_async. An unfinished job's file is kept (its wrapper writes it when the module ends). True when a file
    was removed."""
    if not job.get("finished"):
        return False
    try:
        os.unlink(job_file)
    except FileNotFoundError:
        return False
    return True


def look(status_path: str, lock_path: str, wait_seconds: float, until: list[str], interval: float = 0.5,
         clock=time.monotonic, sleep=time.sleep, job_file: str = "") -> dict:
    """Wait up to `wait_seconds` for the status's state to be one of `until` (with `job_file`: for the job to have
    finished), then probe the lock. Returns {status, ended (the state is one of until), held, holder, taken_at (the
    lock file's mtime: when a writer last took it), now (this host's clock)}, and `job` (read_job) with
    `job_file`. The job is what ends the wait then: a pull writes its last status before it returns its answer."""
    if job_file:
        job, waited, _done = poll_until(lambda: read_job(job_file), lambda j: j["finished"], wait_seconds,
                                        interval, clock, sleep)
        status = read_status(status_path)
        ended = status.get("state") in until
    else:
        status, waited, ended = poll_until(lambda: read_status(status_path), lambda s: s.get("state") in until,
                                           wait_seconds, interval, clock, sleep)
    who = holder(lock_path)
    try:
        taken_at = os.stat(lock_path).st_mtime
    except FileNotFoundError:
        taken_at = None
    out = {"status": status, "ended": ended, "waited_seconds": waited, "held": who is not None, "holder": who,
           "taken_at": taken_at, "now": time.time()}
    if job_file:
        out["job"] = job
    return out
