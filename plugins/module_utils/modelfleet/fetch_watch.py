"""One look of a role's watch at a detached fetch (a hub download or a peer pull): its status file, waited on
until it says the fetch ended or the poll interval is up, and whether a process still holds the model's write
lock. One module call per poll instead of three (wait, read, probe): every module Ansible sends is ~180 KB, and
the watch sends them per host per poll for as long as the transfer takes (docs/fetch.md)."""

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


def look(status_path: str, lock_path: str, wait_seconds: float, until: list[str], interval: float = 0.5,
         clock=time.monotonic, sleep=time.sleep) -> dict:
    """Wait up to `wait_seconds` for the status's state to be one of `until`, then probe the lock. Returns
    {status, ended (the state is one of until), held, holder, taken_at (the lock file's mtime: when a writer last
    took it), now (this host's clock)}."""
    status, waited, ended = poll_until(lambda: read_status(status_path), lambda s: s.get("state") in until,
                                       wait_seconds, interval, clock, sleep)
    who = holder(lock_path)
    try:
        taken_at = os.stat(lock_path).st_mtime
    except FileNotFoundError:
        taken_at = None
    return {"status": status, "ended": ended, "waited_seconds": waited, "held": who is not None, "holder": who,
            "taken_at": taken_at, "now": time.time()}
