#!/usr/bin/python
"""Ansible module shell over modelfleet's planner (plugins/module_utils/modelfleet/planner.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: parallelism_plan
short_description: Decide tensor/expert parallelism and KV-cache room from checkpoint and GPU facts
description:
  - Given the facts C(checkpoint_inspect) returned, the GPU facts (count, memory each, compute
    capability, interconnect) and a profile, returns TP/EP, weight bytes per GPU, KV bytes per token,
    KV token capacity and the largest concurrency that room allows, with the reasons for each choice.
  - Fails (before anything is downloaded or started) when the profile's settings are impossible on
    these GPUs, naming the setting; reports by how much the model does not fit.
  - Pure computation; check mode returns the same plan.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  checkpoint:
    description: The C(checkpoint) result of C(checkpoint_inspect).
    type: dict
    required: true
  gpus:
    description: C(count), C(memory_bytes), C(compute_capability), C(interconnect) (pcie, nvlink, mixed, single).
    type: dict
    required: true
  profile:
    description: A validated profile (C(model_profile)).
    type: dict
  input_len:
    description: Prompt tokens per request for the concurrency estimate.
    type: int
    default: 1024
  output_len:
    description: Generated tokens per request for the concurrency estimate.
    type: int
    default: 1024
  overhead_bytes:
    description: Per-GPU memory reserved for activations, CUDA graphs and communication buffers.
    type: int
    default: 3221225472
  require_fit:
    description: Fail when the weights do not fit.
    type: bool
    default: true
  group_gpus:
    description:
      - The GPU facts of every member of a multi-host replica (the head first; all alike). With O(multi_host), the
        plan is the replica's (pipeline or data parallel across the hosts, TP within each) and a layout that
        cannot hold the model fails, naming what would.
    type: list
    elements: dict
  multi_host:
    description: The replica's layout (C(pp) or C(dp)) and C(nodes), as the fleet file declares it (C(modelfleet_serving_group)).
    type: dict
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
- name: Plan the deployment
  modelfleet.fleet.parallelism_plan:
    checkpoint: "{{ __kimi_facts.checkpoint }}"
    gpus: {count: 8, memory_bytes: 103079215104, compute_capability: "12.0", interconnect: pcie}
    profile: "{{ __profile.profile }}"
  register: __plan
"""

RETURN = r"""
plan:
  description: tensor_parallel_size, expert_parallel, weight_bytes_per_gpu, kv_bytes_per_token, kv_tokens_capacity,
    max_concurrency, reasons, warnings, fits, formulas, and the inputs used; for a replica also layout, nodes,
    pipeline_parallel_size and data_parallel_size.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import group
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.planner import plan


def main():
    module = AnsibleModule(
        argument_spec={
            "checkpoint": {"type": "dict", "required": True},
            "gpus": {"type": "dict", "required": True},
            "profile": {"type": "dict"},
            "input_len": {"type": "int", "default": 1024},
            "output_len": {"type": "int", "default": 1024},
            "overhead_bytes": {"type": "int", "default": 3 * 2**30},
            "require_fit": {"type": "bool", "default": True},
            "group_gpus": {"type": "list", "elements": "dict"},
            "multi_host": {"type": "dict"},
        },
        required_together=[("group_gpus", "multi_host")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["multi_host"]:
            result = group.layout(p["checkpoint"], p["group_gpus"], group.layout_request(p["profile"], p["multi_host"]),
                                  input_len=p["input_len"], output_len=p["output_len"],
                                  overhead_bytes=p["overhead_bytes"])
        else:
            result = plan(p["checkpoint"], p["gpus"], p["profile"], input_len=p["input_len"],
                          output_len=p["output_len"], overhead_bytes=p["overhead_bytes"])
    except ModelfleetError as e:
        module.fail_json(msg=str(e))
    if p["require_fit"] and not result["fits"]:
        module.fail_json(msg=result["reasons"][-1], plan=result)
    module.exit_json(changed=False, plan=result)


if __name__ == "__main__":
    main()
