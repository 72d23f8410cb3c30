#!/usr/bin/python
"""Ansible module shell over modelfleet's venv probe (plugins/module_utils/modelfleet/venv_probe.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: venv_probe
short_description: What a Python venv holds, and whether it already is what the role pins
description:
  - Asks the venv's own python for the installed version of each pinned name and each name that must be absent,
    and says whether the venv is already current (every pin an exact C(name==version) installed at that version,
    none of O(absent) installed). One probe for the vLLM venv (nvidia_env) and the fetch venv (hf_fetch).
  - Reads only; check mode gives the same answer. A venv that does not exist yet is not current.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  python:
    description: The venv's python (for example /opt/modelfleet/vllm/bin/python).
    type: str
    required: true
  pins:
    description: What the venv must hold, as C(name==version).
    type: list
    elements: str
    default: []
  absent:
    description: Names that must not be installed.
    type: list
    elements: str
    default: []
  report:
    description: More names whose installed version is returned in RV(installed), judged by nothing.
    type: list
    elements: str
    default: []
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
- name: Is the vLLM venv already as pinned
  modelfleet.fleet.venv_probe:
    python: /opt/modelfleet/vllm/bin/python
    pins: ["vllm==0.19.1"]
    absent: [torchvision]
  register: __probe
"""

RETURN = r"""
installed:
  description: Each probed name's installed version (null when absent), or null when the venv did not answer.
  returned: always
  type: dict
current:
  description: Whether the venv is already as pinned.
  returned: always
  type: bool
reasons:
  description: Why it is not current (empty when it is).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.venv_probe import judge, pin_name, probe


def main():
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "str", "required": True},
            "pins": {"type": "list", "elements": "str", "default": []},
            "absent": {"type": "list", "elements": "str", "default": []},
            "report": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    installed = probe(p["python"], [pin_name(s) for s in p["pins"]] + list(p["absent"]) + list(p["report"]))
    current, reasons = judge(installed, p["pins"], p["absent"])
    module.exit_json(changed=False, installed=installed, current=current, reasons=reasons)


if __name__ == "__main__":
    main()
