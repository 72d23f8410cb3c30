#!/usr/bin/python
"""Ansible module: write the fleet endpoint's HAProxy configuration, only after HAProxy's own check accepted it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: endpoint_config
short_description: Write the fleet endpoint's HAProxy configuration after HAProxy's own check accepted it
description:
  - Renders one HAProxy frontend and backend per endpoint in O(frontends) (module_utils endpoint.render), each
    replica checked by a real completion of one token, and puts the file at O(path) (root only) only after
    C(haproxy -c) accepted it. A refused configuration fails the task with HAProxy's words and the running one
    stays in place.
  - Every value is checked before it is written (names, ports, addresses, the served name, the API key), so no
    value can add a line or a directive to the file.
  - Reloading the balancer is the caller's (the fleet_endpoint role reloads modelfleet-endpoint.service when
    this changed).
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  frontends:
    description: >-
      The endpoints of this host, as the filter C(endpoint_frontends) makes them - a list of dicts with the keys
      name, port, served_name, api_key, backends (a list of dicts with the keys name, address and port) and left_out.
    type: list
    elements: dict
    required: true
  path: {description: The configuration file., type: path, default: /etc/modelfleet/endpoint/haproxy.cfg}
  bind_address: {description: "The address the frontends listen on (0.0.0.0: every address).", type: str, default: 0.0.0.0}
  check_interval_seconds: {description: Seconds between two checks of a replica., type: float, default: 10}
  check_timeout_seconds: {description: Seconds a check's completion may take before it counts as failed., type: float, default: 30}
  rise: {description: Passed checks in a row before a replica takes requests., type: int, default: 1}
  fall: {description: Failed checks in a row before a replica takes no more requests., type: int, default: 2}
  timeout_seconds:
    description: Seconds a client or a replica may stay silent within one request (a streamed answer included).
    type: float
    default: 600
  retry_request_kib:
    description:
      - The largest request, in KiB, kept to be sent again to another replica when its own fails before answering
        (HAProxy's C(tune.bufsize)); a larger request gets the failure. Each open request holds up to two buffers.
    type: int
    default: 256
  admin_socket: {description: HAProxy's admin socket (the drain and the status read it)., type: path, default: /run/modelfleet-endpoint/admin.sock}
  user: {description: "The user HAProxy drops to after binding (Debian's package makes C(haproxy)).", type: str, default: haproxy}
  haproxy: {description: The HAProxy program that checks the file., type: path, default: /usr/sbin/haproxy}
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: full}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Configure the endpoint of group llama
  modelfleet.fleet.endpoint_config:
    frontends:
      - name: llama
        port: 8080
        served_name: kimi-k2.5
        api_key: ""
        backends:
          - {name: gpu-01, address: 10.0.0.11, port: 8000}
          - {name: gpu-02, address: 10.0.0.12, port: 8000}
  register: endpoint_config
"""

RETURN = r"""
path: {description: The configuration file., returned: always, type: str}
endpoints:
  description: Each endpoint - its name, port, the replicas it names and those it left out (no API key).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.endpoint import install, render
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError


def main():
    module = AnsibleModule(
        argument_spec={
            "frontends": {"type": "list", "elements": "dict", "required": True},
            "path": {"type": "path", "default": "/etc/modelfleet/endpoint/haproxy.cfg"},
            "bind_address": {"type": "str", "default": "0.0.0.0"},
            "check_interval_seconds": {"type": "float", "default": 10},
            "check_timeout_seconds": {"type": "float", "default": 30},
            "rise": {"type": "int", "default": 1},
            "fall": {"type": "int", "default": 2},
            "timeout_seconds": {"type": "float", "default": 600},
            "retry_request_kib": {"type": "int", "default": 256},
            "admin_socket": {"type": "path", "default": "/run/modelfleet-endpoint/admin.sock"},
            "user": {"type": "str", "default": "haproxy"},
            "haproxy": {"type": "path", "default": "/usr/sbin/haproxy"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        text = render(p["frontends"], bind_address=p["bind_address"], check_interval=p["check_interval_seconds"],
                      check_timeout=p["check_timeout_seconds"], rise=p["rise"], fall=p["fall"],
                      timeout=p["timeout_seconds"], admin_socket=p["admin_socket"], user=p["user"],
                      retry_request_kib=p["retry_request_kib"])
        changed, before = install(p["path"], text, haproxy=p["haproxy"], check=module.check_mode)
    except ModelfleetError as e:
        module.fail_json(msg=str(e))
    endpoints = [{"name": fe["name"], "port": fe["port"], "served_name": fe.get("served_name", ""),
                  "replicas": [b["name"] for b in fe.get("backends") or []], "left_out": fe.get("left_out") or []}
                 for fe in p["frontends"]]
    result = {"changed": changed, "path": p["path"], "endpoints": endpoints}
    if module._diff and changed:  # the file holds the checks' API key: the diff shows it masked
        masked = {fe["api_key"] for fe in p["frontends"] if fe.get("api_key")}

        def mask(text_):
            for key in masked:
                text_ = text_.replace(key, "********")
            return text_
        result["diff"] = {"before": mask(before), "after": mask(text), "before_header": p["path"],
                          "after_header": p["path"]}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
