#!/usr/bin/python
"""Ansible module shell over modelfleet's hygiene logic (plugins/module_utils/modelfleet/hygiene.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_port_hygiene
short_description: Find (and, only when allowed, end) stray processes holding GPU memory or the service port
description:
  - Lists processes holding GPU memory (NVML or nvidia-smi) or listening on O(port) whose systemd unit is
    not one of O(allowed_units). These are the dead services' leftovers that block a new model server.
  - Default is report and fail, naming each stray (pid, name, unit, command line, what it holds). With
    O(terminate=true) each is sent TERM, given O(grace_seconds), then KILL; the module then confirms the
    port is free and the GPU memory is released, and fails if not.
  - Check mode reports and ends nothing.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  port: {description: The service port that must be free., type: int}
  allowed_units: {description: Units allowed to hold the GPUs or the port (the service being deployed)., type: list, elements: str, default: []}
  terminate: {description: "End the strays (TERM, wait, KILL).", type: bool, default: false}
  grace_seconds: {description: Seconds between TERM and KILL., type: float, default: 10}
  check_gpus: {description: Also look at GPU memory holders., type: bool, default: true}
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Make sure nothing stray holds the GPUs or port 8000
  modelfleet.fleet.gpu_port_hygiene:
    port: 8000
    allowed_units: [modelfleet-vllm@kimi-k2.5.service]
"""

RETURN = r"""
strays: {description: 'The strays found: pid, name, unit, cmdline, holds.', returned: always, type: list, elements: dict}
terminated: {description: pid -> TERM or KILL., returned: always, type: dict}
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.gpu import collect
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.hygiene import (
    alive,
    classify_holders,
    describe,
    port_holders,
    terminate,
)


def find(port, check_gpus):
    holders = {}
    if port:
        for h in port_holders(port):
            holders.setdefault(h["pid"], {**describe(h["pid"]), "holds": []})["holds"].append(f"port {port}")
    gpu = None
    if check_gpus:
        gpu = collect()
        for p in gpu["processes"]:
            if p.get("pid"):
                d = holders.setdefault(p["pid"], {**describe(p["pid"]), "holds": []})
                d["holds"].append(f"{p['bytes']} bytes on GPU {p['gpu_index']}")
    return list(holders.values()), gpu


def main():
    module = AnsibleModule(
        argument_spec={
            "port": {"type": "int"},
            "allowed_units": {"type": "list", "elements": "str", "default": []},
            "terminate": {"type": "bool", "default": False},
            "grace_seconds": {"type": "float", "default": 10},
            "check_gpus": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    me = {os.getpid(), os.getppid()}
    holders, gpu = find(p["port"], p["check_gpus"])
    strays = classify_holders(holders, p["allowed_units"], me)
    if not strays:
        module.exit_json(changed=False, strays=[], terminated={},
                         gpu_reason=gpu["reason"] if gpu else None)
    lines = "; ".join(f"pid {s['pid']} ({s['name']}, unit {s['unit'] or 'none'}) holds {', '.join(s['holds'])}: "
                      f"{s['cmdline']}" for s in strays)
    if not p["terminate"] or module.check_mode:
        module.fail_json(msg=f"{len(strays)} stray process(es) not owned by {p['allowed_units'] or 'any allowed unit'} "
                             f"would block the service: {lines}. Stop them, or set terminate "
                             "(nvidia_env_terminate_strays: true) to end them.", strays=strays, terminated={})
    how = terminate([s["pid"] for s in strays], p["grace_seconds"])
    left = [s["pid"] for s in strays if alive(s["pid"])]
    holders2, _dummy = find(p["port"], p["check_gpus"])
    still = classify_holders(holders2, p["allowed_units"], me)
    if left or still:
        module.fail_json(msg=f"strays survived TERM and KILL or the resources are still held: pids {left}, holders "
                             f"{[s['pid'] for s in still]}", strays=strays, terminated=how)
    module.exit_json(changed=True, strays=strays, terminated=how,
                     msg=f"ended {len(strays)} stray process(es); port {p['port']} free and GPU memory released")


if __name__ == "__main__":
    main()
