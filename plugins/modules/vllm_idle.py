#!/usr/bin/python
"""Ansible module: wait until vLLM servers hold no request (their own running and waiting gauges), bounded."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_idle
short_description: Wait until vLLM servers hold no request, from their own running and waiting gauges
description:
  - Reads C(vllm:num_requests_running) and C(vllm:num_requests_waiting) on each server's C(/metrics) until both
    are 0 on every server, or O(timeout_seconds) has passed. Used after a replica was taken out of its endpoint,
    before its unit is stopped - the requests it holds finish first.
  - A server that does not answer holds nothing. Never fails on a timeout; C(idle) and C(in_flight) say what was
    left (those requests end with the stop).
  - Read-only.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  urls: {description: "The servers' base URLs, e.g. http://127.0.0.1:8000.", type: list, elements: str, required: true}
  timeout_seconds: {description: How long to wait., type: float, default: 120}
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Let the requests it holds finish
  modelfleet.fleet.vllm_idle:
    urls: [http://127.0.0.1:8000]
    timeout_seconds: 120
"""

RETURN = r"""
idle: {description: Every server holds no request., returned: always, type: bool}
in_flight: {description: "Per URL, the requests held at the last look (null: not answering).", returned: always, type: dict}
waited_seconds: {description: How long it waited., returned: always, type: float}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.poll import poll_until
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.readiness import in_flight


def main():
    module = AnsibleModule(
        argument_spec={
            "urls": {"type": "list", "elements": "str", "required": True},
            "timeout_seconds": {"type": "float", "default": 120},
        },
        supports_check_mode=True,
    )
    held, waited, idle = poll_until(lambda: {u: in_flight(u) for u in module.params["urls"]},
                                    lambda h: all(not n for n in h.values()), module.params["timeout_seconds"], 0.5)
    module.exit_json(changed=False, idle=idle, in_flight=held, waited_seconds=waited)


if __name__ == "__main__":
    main()
