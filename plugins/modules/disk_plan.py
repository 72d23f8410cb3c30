#!/usr/bin/python
"""Ansible module shell over modelfleet's disk arithmetic (plugins/module_utils/modelfleet/disk.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: disk_plan
short_description: Plan exactly which model directories to delete to make room, never what is in use
description:
  - Measures the models root (statvfs C(f_bavail), or the ZFS dataset's C(available)), every model
    directory's allocated and apparent bytes, and which model directories active vLLM units serve
    (read from systemd on the host).
  - Returns the shortest deletion list (explicit entries first, then least recently used) that covers
    the shortfall for O(required_bytes) plus headroom, and the explicit entries deferred until after the
    new model is verified. Never proposes a path outside the root, the root itself, a protected path,
    a model in use or the model being deployed.
  - Read-only, it deletes nothing (the storage_cleanup role does, from this plan).
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  root:
    description: The models root.
    type: path
    required: true
  required_bytes:
    description: Bytes the new model needs (e.g. C(checkpoint.total_bytes) from checkpoint_inspect).
    type: raw
    required: true
  headroom_bytes:
    description: Bytes to keep free beyond the model.
    type: int
    default: 0
  headroom_percent:
    description: Percent of the filesystem to keep free beyond the model (the larger headroom wins).
    type: float
    default: 0.0
  explicit:
    description: Model directories to delete first (in this order).
    type: list
    elements: path
    default: []
  protected:
    description: Paths under the root never to delete.
    type: list
    elements: path
    default: []
  in_use:
    description: Extra in-use model directories (added to those found from active units).
    type: list
    elements: path
    default: []
  deploying:
    description: The directories of the model being deployed (final and staging).
    type: list
    elements: path
    default: []
  present_bytes:
    description: Bytes of the target already on disk (a partial download), subtracted from the need.
    type: int
    default: 0
  defer_explicit:
    description: Explicit entries not needed to cover the shortfall are deferred until after verification.
    type: bool
    default: true
  read_units:
    description:
      - Read the host's live services (active, activating, reloading, auto-restart) to protect every model
        folder they reference. When systemd cannot be read the module fails; false is the explicit opt-out
        (running processes with files, maps, command line or mounts under the root are protected either way).
    type: bool
    default: true
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Plan room for Kimi-K2.5
  modelfleet.fleet.disk_plan:
    root: /models
    required_bytes: "{{ __checkpoint.checkpoint.total_bytes }}"
    headroom_percent: 5
    explicit: [/models/Kimi-K2.5-NVFP4]
  register: __disk
"""

RETURN = r"""
plan:
  description: >-
    free_bytes, required_bytes, shortfall_bytes, delete (list of path and bytes), delete_after_verify,
    refused (list of path and reason), feasible, free_after_* figures, figures (bytes, GB and GiB), message.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.disk import plan_host
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import parse_size


def main():
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "required_bytes": {"type": "raw", "required": True},
            "headroom_bytes": {"type": "int", "default": 0},
            "headroom_percent": {"type": "float", "default": 0.0},
            "explicit": {"type": "list", "elements": "path", "default": []},
            "protected": {"type": "list", "elements": "path", "default": []},
            "in_use": {"type": "list", "elements": "path", "default": []},
            "deploying": {"type": "list", "elements": "path", "default": []},
            "present_bytes": {"type": "int", "default": 0},
            "defer_explicit": {"type": "bool", "default": True},
            "read_units": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        required = parse_size(p["required_bytes"])
    except ValueError as e:
        module.fail_json(msg=f"disk_plan: required_bytes: {e}")
    try:
        plan = plan_host(root=p["root"], required_bytes=required, headroom_bytes=p["headroom_bytes"],
                         headroom_percent=p["headroom_percent"], explicit=p["explicit"], protected=p["protected"],
                         in_use=p["in_use"], deploying=p["deploying"], present_bytes=p["present_bytes"],
                         defer_explicit=p["defer_explicit"], read_units=p["read_units"])
    except ModelfleetError as e:
        module.fail_json(msg=f"disk_plan: {e}")
    module.exit_json(changed=False, plan=plan)


if __name__ == "__main__":
    main()
