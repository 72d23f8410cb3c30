#!/usr/bin/python
"""Ansible module shell: the network preflight of a multi-host group (group_check.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_group_check
short_description: Check that a multi-host group's members reach each other, and measure an all-reduce
description:
  - Runs, with the serving venv's python, one rendezvous at the group's head and a few all-reduces of
    I(size_bytes) through torch.distributed - NCCL on GPU hosts, gloo on CPU hosts, the backends vLLM's own
    workers use - with the member's environment (VLLM_HOST_IP, GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME).
  - Every member of the group must run it at the same time (the role starts it asynchronously on all members);
    a member that cannot reach the head, or is missing, fails with the address and port it waited for.
  - Changes nothing on the host, so it runs in check mode too.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  python: {description: The serving venv's python (torch)., type: str, required: true}
  members:
    description: The group's members, as the group_members filter derives them (the head first).
    type: list
    elements: dict
    required: true
  host: {description: This member's inventory name., type: str, required: true}
  port: {description: "The rendezvous port at the head; 0: the group's port + 1 (the running group holds its own).", type: int, default: 0}
  size_bytes: {description: Bytes each all-reduce carries., type: int, default: 67108864}
  iterations: {description: Timed all-reduces (after one untimed)., type: int, default: 5}
  timeout: {description: Seconds to wait for every member at the rendezvous and in each collective., type: int, default: 60}
  gpu_count: {description: The host's GPUs; with one or more (and CUDA seen by torch) the backend is NCCL., type: int, default: 0}
  backend:
    description: The collective backend; auto is NCCL on GPU hosts, gloo otherwise.
    type: str
    choices: [auto, gloo, nccl]
    default: auto
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
- name: Check the group's network before anything is stopped
  modelfleet.fleet.vllm_group_check:
    python: /opt/modelfleet/vllm/bin/python
    members: "{{ vllm_service_group_members }}"
    host: "{{ inventory_hostname }}"
  async: 150
  poll: 0
  register: __job
"""

RETURN = r"""
network:
  description:
    - The figures this member measured - backend, device, world, bytes, iterations, median_seconds,
      algbw_bytes_per_s, busbw_bytes_per_s (algbw x 2(n-1)/n, as nccl-tests), join_seconds, torch and nccl versions.
  returned: success
  type: dict
msg:
  description: The figures in one line.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import PlanError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.group_check import (
    describe,
    failure,
    parse,
    run,
    spec,
    summarise,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "str", "required": True},
            "members": {"type": "list", "elements": "dict", "required": True},
            "host": {"type": "str", "required": True},
            "port": {"type": "int", "default": 0},
            "size_bytes": {"type": "int", "default": 64 * 2**20},
            "iterations": {"type": "int", "default": 5},
            "timeout": {"type": "int", "default": 60},
            "gpu_count": {"type": "int", "default": 0},
            "backend": {"type": "str", "default": "auto", "choices": ["auto", "gloo", "nccl"]},
        },
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode and not os.path.exists(p["python"]):
        module.exit_json(changed=False, network={}, msg=f"not checked: {p['python']} is not installed yet (check "
                                                        "mode); the deploy checks the group's network once it is")
    try:
        s = spec(p["members"], p["host"], p["port"], p["size_bytes"], p["iterations"], p["timeout"], p["gpu_count"],
                 p["backend"])
        rc, output = run(p["python"], s)
        out = parse(output) if rc == 0 else None
        if out is None:
            module.fail_json(msg=f"vllm_group_check: {failure(s, p['host'], rc, output)} (nothing was stopped)")
        fig = summarise(out)
    except PlanError as e:
        module.fail_json(msg=f"vllm_group_check: {e} (nothing was stopped)")
    module.exit_json(changed=False, network=fig, msg=describe(fig))


if __name__ == "__main__":
    main()
