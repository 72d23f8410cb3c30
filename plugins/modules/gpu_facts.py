#!/usr/bin/python
"""Ansible module shell over modelfleet's GPU facts (plugins/module_utils/modelfleet/gpu.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: NVIDIA GPU facts - memory, compute capability, interconnect, processes holding memory
description:
  - Uses NVML (nvidia-ml-py) where present, else nvidia-smi's machine-readable outputs (C(-q -x) XML,
    C(--query-gpu) CSV, C(topo -m)); never the human table view.
  - Returns per GPU index, uuid, name, PCI bus id, memory total/used/free in bytes, compute capability,
    power limit; the driver and CUDA driver versions, the GPU count, the interconnect matrix between every
    pair (NV# or PIX/PXB/PHB/NODE/SYS) summarised as nvlink, pcie, mixed or single; and the processes
    holding GPU memory with pid, name, bytes, GPU and the systemd unit owning the pid.
  - On a host without NVIDIA GPUs returns gpu_count 0 and the reason (no driver, no device).
  - Read-only.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  prefer_nvml: {description: Try NVML before nvidia-smi., type: bool, default: true}
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Read the GPUs
  modelfleet.fleet.gpu_facts:
  register: __gpus
"""

RETURN = r"""
gpu_facts:
  description: >-
    source, driver_version, cuda_driver_version, gpu_count, gpus, processes, interconnect, interconnect_matrix,
    compute_capabilities, min_memory_total_bytes, reason.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.gpu import collect


def main():
    module = AnsibleModule(argument_spec={"prefer_nvml": {"type": "bool", "default": True}}, supports_check_mode=True)
    facts = collect(prefer_nvml=module.params["prefer_nvml"])
    module.exit_json(changed=False, gpu_facts=facts, ansible_facts={"modelfleet_gpus": facts})


if __name__ == "__main__":
    main()
