#!/usr/bin/python
"""Ansible module: take one replica out of its fleet endpoint, or put it back and wait until it takes requests."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: endpoint_server
short_description: Take a replica out of its fleet endpoint (maint), or put it back and wait until it takes requests
description:
  - Runs on the endpoint host (delegate to it). With O(state=maint) the balancer sends the replica no new request
    and stops checking it; the requests it holds go on (the caller waits for them from the replica's own gauges,
    module vllm_idle). With O(state=ready) it is checked again and takes requests after its first passed check;
    the module waits up to O(wait_seconds) for that and reports whether it came.
  - Changes nothing when no endpoint runs on the host (no admin socket) or its replica is already in that state.
  - The vllm_service role uses it around a switch of a replica's unit (drain before stop; back after ready or
    after a rollback).
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  endpoint: {description: The endpoint (the fleet file's group)., type: str, required: true}
  replica: {description: The replica (its inventory name)., type: str, required: true}
  state: {description: maint (out) or ready (back)., type: str, choices: [maint, ready], required: true}
  wait_seconds:
    description: >-
      With state=ready, how long to wait until it takes requests; with state=maint, how long to wait until the
      balancer holds no request of it any more (its own count: a request handed over may not be in vLLM's gauges yet).
    type: float
    default: 120
  admin_socket: {description: HAProxy's admin socket., type: path, default: /run/modelfleet-endpoint/admin.sock}
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Take gpu-02 out of endpoint llama
  modelfleet.fleet.endpoint_server:
    endpoint: llama
    replica: gpu-02
    state: maint
  delegate_to: gpu-01
"""

RETURN = r"""
present: {description: An endpoint with this replica runs on the host., returned: always, type: bool}
before: {description: "The replica's state before (status, current and total requests, last check).", returned: always, type: dict}
after: {description: Its state after., returned: always, type: dict}
up: {description: "With state=ready, whether it takes requests again.", returned: always, type: bool}
waited_seconds: {description: How long it waited (for its requests to end with maint; to take requests with ready)., returned: always, type: float}
msg: {description: What happened., returned: always, type: str}
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.endpoint import server_states, set_state
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.poll import poll_until


def main():
    module = AnsibleModule(
        argument_spec={
            "endpoint": {"type": "str", "required": True},
            "replica": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["maint", "ready"], "required": True},
            "wait_seconds": {"type": "float", "default": 120},
            "admin_socket": {"type": "path", "default": "/run/modelfleet-endpoint/admin.sock"},
        },
        supports_check_mode=True,
    )
    p = module.params
    name = f"{p['endpoint']}/{p['replica']}"
    result = {"changed": False, "present": False, "before": {}, "after": {}, "up": False, "waited_seconds": 0.0}
    if not os.path.exists(p["admin_socket"]):
        module.exit_json(msg=f"no endpoint runs here ({p['admin_socket']} is absent): nothing to do for {name}",
                         **result)

    def replica():
        return server_states(p["admin_socket"])[p["endpoint"]][p["replica"]]

    try:
        current = server_states(p["admin_socket"]).get(p["endpoint"], {}).get(p["replica"])
        if current is None:
            module.exit_json(msg=f"the endpoint has no replica {name} yet: nothing to do", **result)
        result.update(present=True, before=current, after=current)
        in_maint = current["status"].startswith("MAINT")
        if p["state"] == "maint" and in_maint or p["state"] == "ready" and not in_maint:
            result["up"] = current["status"] == "UP"
            module.exit_json(msg=f"{name} is already {current['status']}", **result)
        if module.check_mode:
            result["changed"] = True
            module.exit_json(msg=f"would set {name} to {p['state']}", **result)
        result.update(set_state(p["endpoint"], p["replica"], p["state"], p["admin_socket"]), changed=True)
        if p["state"] == "maint":
            # the requests the balancer already handed to it (some may not be in vLLM's gauges yet: still being
            # read or tokenized) are over only when the balancer's own count of them is 0
            result["after"], result["waited_seconds"], _idle = poll_until(
                replica, lambda s: not s.get("current"), p["wait_seconds"], 0.2)
        if p["state"] == "ready":
            result["after"], result["waited_seconds"], result["up"] = poll_until(
                replica, lambda s: s["status"] == "UP", p["wait_seconds"], 0.5)
    except (OSError, ModelfleetError) as e:
        module.fail_json(msg=f"{name}: {e}", **result)
    module.exit_json(msg=f"{name}: {result['before']['status']} -> {result['after']['status']}", **result)


if __name__ == "__main__":
    main()
