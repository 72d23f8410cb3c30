#!/usr/bin/python
"""Ansible module: the fleet endpoint's view of its replicas, waiting until the expected ones take requests."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: endpoint_status
short_description: Read which replicas the fleet endpoint sends requests to, waiting for the expected ones
description:
  - Reads HAProxy's own view of every replica (C(show stat) on its admin socket) - UP, DOWN, the last check's
    words, the requests in flight and so far.
  - With O(frontends), waits up to O(wait_seconds) until each replica they name is UP; one that is not fails the
    task with the balancer's reason (a replica that listens on loopback only, seen from another host, is refused
    connections - the message says so).
  - Read-only.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  admin_socket: {description: HAProxy's admin socket., type: path, default: /run/modelfleet-endpoint/admin.sock}
  frontends:
    description: The endpoints as the module endpoint_config took them; each replica in their backends must be UP.
    type: list
    elements: dict
    default: []
  wait_seconds: {description: How long to wait for the expected replicas., type: float, default: 0}
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Wait until both replicas take requests
  modelfleet.fleet.endpoint_status:
    frontends: "{{ fleet_endpoint_frontends }}"
    wait_seconds: 120
"""

RETURN = r"""
states:
  description: "Per endpoint, per replica - status (UP, DOWN...), current and total requests, the last check."
  returned: always
  type: dict
waited_seconds: {description: How long it waited., returned: always, type: float}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.endpoint import not_up, server_states
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.poll import poll_until


def main():
    module = AnsibleModule(
        argument_spec={
            "admin_socket": {"type": "path", "default": "/run/modelfleet-endpoint/admin.sock"},
            "frontends": {"type": "list", "elements": "dict", "default": []},
            "wait_seconds": {"type": "float", "default": 0},
        },
        supports_check_mode=True,
    )
    p = module.params
    expect = {fe["name"]: [b["name"] for b in fe.get("backends") or []] for fe in p["frontends"]}

    def read():
        try:
            states = server_states(p["admin_socket"])
            return states, not_up(states, expect)
        except (OSError, ModelfleetError) as e:
            return {}, [f"the balancer's admin socket {p['admin_socket']} does not answer ({e})"]

    (states, missing), waited, up = poll_until(read, lambda r: not r[1], p["wait_seconds"], 1)
    if not up:
        module.fail_json(msg=f"after {waited:.0f} s the endpoint does not send requests to every replica it "
                             f"names: {'; '.join(missing)}", states=states, waited_seconds=waited)
    module.exit_json(changed=False, states=states, waited_seconds=waited)


if __name__ == "__main__":
    main()
