#!/usr/bin/python
"""Ansible module shell over modelfleet's host gates (plugins/module_utils/modelfleet/gates.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: environment_gates
short_description: The gates a host passes before anything is downloaded or started
description:
  - From the GPU facts (C(gpu_facts)) and the profile, checks in one place that a GPU host has a usable GPU, the
    driver is at least the required one, the compute capability is inside the profile's range (Blackwell for
    NVFP4), FP8 KV cache is not asked for on SM120, and the vLLM version to install satisfies the profile's range
    (every bound, upper ones included).
  - Fails with every failed gate named, each with its fix; changes nothing (check mode gives the same answer).
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  host:
    description: The host's name, for the messages.
    type: str
    required: true
  gpu_facts:
    description: The C(gpu_facts) result of C(gpu_facts) (ignored for a CPU host).
    type: dict
    default: {}
  profile:
    description: A validated profile (C(model_profile)).
    type: dict
    default: {}
  accelerator:
    description: nvidia (the GPU gates apply) or cpu (only the vLLM version range).
    type: str
    default: nvidia
    choices: [nvidia, cpu]
  vllm_version:
    description: The vLLM version that will be installed.
    type: str
  min_driver_version:
    description: The driver minimum; empty for the profile's C(constraints.min_driver_version).
    type: str
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
- name: Check the host before anything is downloaded
  modelfleet.fleet.environment_gates:
    host: "{{ inventory_hostname }}"
    gpu_facts: "{{ __gpus.gpu_facts }}"
    profile: "{{ __profile.profile }}"
    vllm_version: "0.19.1"
"""

RETURN = r"""
problems:
  description: Every failed gate (empty when the host may go ahead).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.gates import environment_problems


def main():
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "gpu_facts": {"type": "dict", "default": {}},
            "profile": {"type": "dict", "default": {}},
            "accelerator": {"type": "str", "default": "nvidia", "choices": ["nvidia", "cpu"]},
            "vllm_version": {"type": "str"},
            "min_driver_version": {"type": "str"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        problems = environment_problems(p["host"], p["gpu_facts"], p["profile"], p["accelerator"],
                                        p["vllm_version"], p["min_driver_version"])
    except ModelfleetError as e:
        module.fail_json(msg=f"nvidia_env: {e}", problems=[])
    if problems:
        module.fail_json(msg="nvidia_env: " + "; ".join(problems), problems=problems)
    module.exit_json(changed=False, problems=[])


if __name__ == "__main__":
    main()
