#!/usr/bin/python
"""Ansible module shell over module_utils reclaim.reclaim: plan and delete under a host-wide lock."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: storage_reclaim
short_description: Free exactly the space a new model needs, under a host-wide lock, keeping the fallback
description:
  - Takes a host-wide lock, measures and plans (the same plan as M(modelfleet.fleet.disk_plan), computed inside the
    lock so it cannot be stale), then deletes the planned model directories one by one (completion
    marker first, atomic move to a trash folder, removal) and logs each deletion.
  - O(mode=make_room) deletes only what the shortfall needs. If that includes a fallback path (the
    model a new one replaces) and O(allow_delete_fallback) is false, it fails before deleting anything.
    Explicit deletions not needed now are returned as C(delete_after_verify).
  - O(mode=remove_explicit) deletes the O(explicit) entries (used after the new model has been
    verified and is serving), re-checking every guard.
  - Check mode computes the plan and deletes nothing. Diff mode shows the model directories before and after.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  root: {description: The models root., type: path, required: true}
  required_bytes: {description: Bytes the new model needs (make_room)., type: raw, default: 0}
  headroom_bytes: {description: Bytes to keep free beyond the model., type: int, default: 0}
  headroom_percent: {description: Percent of the filesystem to keep free (the larger headroom wins)., type: float, default: 0.0}
  explicit: {description: "Model directories to delete first, in order.", type: list, elements: path, default: []}
  protected: {description: Paths under the root never to delete., type: list, elements: path, default: []}
  in_use: {description: Extra in-use model directories (added to those found from active units)., type: list, elements: path, default: []}
  deploying: {description: Directories of the model being deployed., type: list, elements: path, default: []}
  fallback: {description: Model directories that are the fallback for the new model., type: list, elements: path, default: []}
  allow_delete_fallback: {description: Allow deleting a fallback before the new model is verified., type: bool, default: false}
  present_bytes: {description: Bytes of the target already on disk., type: int, default: 0}
  mode: {description: What to do., type: str, choices: [make_room, remove_explicit], default: make_room}
  log_path: {description: JSON-lines log of deletions., type: path, default: /var/log/modelfleet/storage.log}
  lock_path: {description: The host-wide lock file., type: path, default: /run/lock/modelfleet-storage.lock}
  lock_wait_seconds: {description: How long to wait for another run's lock., type: float, default: 0}
  run_id: {description: Identifies this run in the lock and the log., type: str, default: ""}
  read_units:
    description:
      - Read the host's live services to protect every model folder they reference; when systemd cannot be
        read the module fails (false is the explicit opt-out). Running processes are always read.
    type: bool
    default: true
attributes:
  platform:
    platforms: posix
  check_mode:
    support: full
  diff_mode:
    support: full
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Make room for Kimi-K2.5, keeping the NVFP4 fallback if space allows
  modelfleet.fleet.storage_reclaim:
    root: /models
    required_bytes: 595148192736
    headroom_percent: 5
    explicit: [/models/Kimi-K2.5-NVFP4]
    fallback: [/models/Kimi-K2.5-NVFP4]
"""

RETURN = r"""
plan: {description: The plan computed under the lock (see disk_plan)., returned: always, type: dict}
deleted:
  description: Deleted directories with the bytes each freed.
  returned: always
  type: list
  elements: dict
free_bytes_after: {description: Free bytes measured after deleting., returned: always, type: int}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.reclaim import MODES, ReclaimError, reclaim


def main():
    spec = {
        "root": {"type": "path", "required": True},
        "required_bytes": {"type": "raw", "default": 0},
        "headroom_bytes": {"type": "int", "default": 0},
        "headroom_percent": {"type": "float", "default": 0.0},
        "explicit": {"type": "list", "elements": "path", "default": []},
        "protected": {"type": "list", "elements": "path", "default": []},
        "in_use": {"type": "list", "elements": "path", "default": []},
        "deploying": {"type": "list", "elements": "path", "default": []},
        "fallback": {"type": "list", "elements": "path", "default": []},
        "allow_delete_fallback": {"type": "bool", "default": False},
        "present_bytes": {"type": "int", "default": 0},
        "mode": {"type": "str", "choices": list(MODES), "default": "make_room"},
        "log_path": {"type": "path", "default": "/var/log/modelfleet/storage.log"},
        "lock_path": {"type": "path", "default": "/run/lock/modelfleet-storage.lock"},
        "lock_wait_seconds": {"type": "float", "default": 0},
        "run_id": {"type": "str", "default": ""},
        "read_units": {"type": "bool", "default": True},
    }
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    try:
        result = reclaim(**module.params, check_mode=module.check_mode)
    except ReclaimError as e:
        module.fail_json(msg=str(e), **e.details)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
