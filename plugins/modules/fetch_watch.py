#!/usr/bin/python
"""Ansible module: one look of the watch at a detached fetch - its status, and whether its writer still lives."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fetch_watch
short_description: One look at a detached fetch - its status file, and whether a process holds the model's write lock
description:
  - Waits up to O(wait_seconds) for the fetch's status file (C(<root>/.status/<model>@<commit>.json)) to give a
    state in O(until), reads it, then probes the model's one-writer lock file (C(<root>/.status/<model>@<commit>.flock),
    the C(status) and C(flock) paths of lookup C(modelfleet.fleet.model_paths)). The lock is held by a hub download,
    a peer pull or a re-verification for as long as it writes, and the kernel frees it when that process ends,
    however it ends.
  - The hf_fetch role's watch calls it once per poll while the job has not finished, with O(job_file), the one
    module per poll instead of a wait, a read, a probe and async_status (each module Ansible sends is about 180
    KB, per host and per poll). A job whose writer is gone (killed with Ansible's async wrapper, by the
    out-of-memory killer, or a host restart) never finishes; filter C(modelfleet.fleet.job_watch) tells it from
    this module's answers. Called once before the job starts (O(wait_seconds=0)), its C(now) tells whether a
    writer took the lock since (C(taken_at)), even one the watch never saw.
  - Never creates a file, and changes nothing but the finished job's results file with O(remove_finished_job); it
    holds the lock only for the instant of the probe, which a writer that starts in that instant waits out.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  status: {description: The fetch's status file., type: path, required: true}
  flock: {description: The model's write-lock file., type: path, required: true}
  wait_seconds:
    description:
      - How long to wait for a state in O(until); 0 looks once. With O(wait_max_seconds) and O(since), the shortest
        wait.
    type: float
    default: 0
  wait_max_seconds:
    description:
      - With O(since), the wait grows with the time the fetch has run - half of it, from O(wait_seconds) up to this
        (a long transfer's watch sends fewer modules). 0, or not above O(wait_seconds), waits O(wait_seconds).
    type: float
    default: 0
  since:
    description: When the fetch started, in seconds since the epoch by this host's clock (the C(now) of a look before
      the job started).
    type: float
  until:
    description: The states that end the wait (a fetch's end, as its status file says it).
    type: list
    elements: str
    default: [complete, received, failed]
  job_file:
    description:
      - The async job's results file (C(results_file) of the task started with C(async)). Given, the wait ends when
        the job has finished (rather than on O(until)), and C(job) says what ansible.builtin.async_status would.
    type: path
  remove_finished_job:
    description:
      - With O(job_file), remove that file once it says the job has finished (after its answer was read into C(job)),
        as C(ansible.builtin.async_status) with C(mode=cleanup) does. Never in check mode; never an unfinished job's.
        The module reports C(changed) exactly when it removed the file.
    type: bool
    default: false
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Wait one interval for the download, and see whether its process still writes the model
  modelfleet.fleet.fetch_watch:
    status: "{{ paths.status }}"
    flock: "{{ paths.flock }}"
    wait_seconds: 10
    wait_max_seconds: 60
    since: "{{ before.now }}"
    until: [complete, failed]
    job_file: "{{ job.results_file }}"
    remove_finished_job: true
  register: look
"""

RETURN = r"""
status: {description: "The status file's content ({} when there is none yet).", returned: always, type: dict}
ended: {description: "The status's state is one of O(until).", returned: always, type: bool}
waited_seconds: {description: How long it waited., returned: always, type: float}
wait_seconds: {description: "How long it would have waited at most (O(wait_seconds), grown with O(since)).",
               returned: always, type: float}
held: {description: A process holds the model's write lock now., returned: always, type: bool}
holder: {description: "What the holder wrote in the lock file (its pid), or null when none holds it.",
         returned: always, type: str}
taken_at: {description: "When a writer last took the lock (it writes its pid into the file then), in seconds since
           the epoch by this host's clock; null when there is no such file.", returned: always, type: float}
now: {description: "This host's clock after the look, in seconds since the epoch.", returned: always, type: float}
job:
  description:
    - What ansible.builtin.async_status says of the job (C(finished); once finished, the module's answer), or a
      failure naming the results file when there is none.
  returned: when O(job_file) is given
  type: dict
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch_watch import (
    grown_wait,
    look,
    remove_finished,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "status": {"type": "path", "required": True},
            "flock": {"type": "path", "required": True},
            "wait_seconds": {"type": "float", "default": 0},
            "wait_max_seconds": {"type": "float", "default": 0},
            "since": {"type": "float"},
            "until": {"type": "list", "elements": "str", "default": ["complete", "received", "failed"]},
            "job_file": {"type": "path"},
            "remove_finished_job": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    wait = p["wait_seconds"]
    if p["since"] is not None:
        wait = grown_wait(wait, p["wait_max_seconds"], time.time() - p["since"])
    try:
        res = look(p["status"], p["flock"], wait, p["until"], job_file=p["job_file"] or "")
    except OSError as e:
        module.fail_json(msg=f"{p['flock']}: cannot probe the model's write lock ({e.strerror}); check that the "
                             "models root is mounted and readable")
    for w in (res.get("job") or {}).get("warnings") or []:  # what async_status would show: the job's own warnings
        module.warn(str(w))
    removed = False
    if p["job_file"] and p["remove_finished_job"] and not module.check_mode:
        try:
            removed = remove_finished(p["job_file"], res["job"])
        except OSError as e:
            module.warn(f"{p['job_file']}: the finished job's results file could not be removed ({e.strerror})")
    module.exit_json(changed=removed, wait_seconds=wait, **res)


if __name__ == "__main__":
    main()
