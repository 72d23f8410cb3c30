#!/usr/bin/python
"""Ansible module: whether a process holds a model's write lock (the one writer of its staging and final tree)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_write_lock
short_description: Whether a process holds a model's write lock
description:
  - Probes the model's one-writer lock file (C(<root>/.status/<model>@<commit>.flock), the C(flock) path of lookup
    C(modelfleet.fleet.model_paths)), held by a hub download, a peer pull or a re-verification for as long as it
    writes, and released by the kernel when that process ends, however it ends.
  - The role's watch of a detached fetch asks this while the job has not finished. A job whose writer is gone
    (killed with Ansible's async wrapper, by the out-of-memory killer, or a host restart) never finishes, and
    the watch would otherwise wait its whole timeout (24 hours by default). Probed once before the job starts
    (C(now)), it also tells whether a writer took the lock since (C(taken_at)), even one the watch never saw.
  - Read-only. Never creates the file; it holds the lock only for the instant of the probe, which a writer that
    starts in that instant waits out.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  path: {description: The model's lock file., type: path, required: true}
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: See whether the fetch still writes the model
  modelfleet.fleet.model_write_lock:
    path: "{{ lookup('modelfleet.fleet.model_paths', 'org/name', commit, root='/models').flock }}"
  register: writer
"""

RETURN = r"""
held: {description: A process holds the lock now., returned: always, type: bool}
holder: {description: "What the holder wrote in the file (its pid), or null when none holds it.", returned: always,
         type: str}
taken_at: {description: "When a writer last took the lock (it writes its pid into the file then), in seconds since
           the epoch by this host's clock; null when there is no such file.", returned: always, type: float}
now: {description: "This host's clock at the probe, in seconds since the epoch.", returned: always, type: float}
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.flock import holder


def main():
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True}}, supports_check_mode=True)
    path = module.params["path"]
    now = time.time()
    try:
        who = holder(path)
        taken_at = os.stat(path).st_mtime
    except FileNotFoundError:
        taken_at = None
    except OSError as e:
        module.fail_json(msg=f"{path}: cannot probe the model's write lock ({e.strerror}); check that the models root "
                             "is mounted and readable")
    module.exit_json(changed=False, held=who is not None, holder=who, taken_at=taken_at, now=now)


if __name__ == "__main__":
    main()
