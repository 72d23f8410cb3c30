#!/usr/bin/python
"""Ansible module shell: the vLLM server command line and unit settings (vllm_unit.py), validated."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_unit
short_description: Compute and validate a vLLM unit's command line from a profile, a plan and the fetched model
description:
  - Returns the argv (one flag per element), the unit name, the start timeout sized from the model
    (bytes / load rate + base), and refuses bad input before anything is stopped or written (TP larger than
    the GPU count, a non-loopback host without an API key, trust_remote_code without a pinned commit,
    a port outside 1-65535).
  - Pure computation; check mode returns the same.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  python: {description: The venv's python., type: str, required: true}
  model_dir: {description: The complete model directory., type: str, required: true}
  profile: {description: The validated profile., type: dict, required: true}
  plan: {description: The parallelism plan., type: dict}
  host: {description: Listen address., type: str, default: 127.0.0.1}
  port: {description: Listen port., type: int, default: 8000}
  revision: {description: The model's 40-hex commit., type: str}
  gpu_count: {description: GPUs on the host (0 on CPU hosts)., type: int}
  api_key_set: {description: Whether an API key will be configured., type: bool, default: false}
  api_key:
    description:
      - The API key, checked only (never returned) - one line of printable ASCII without blanks, quotes,
        backslash or '$', so the environment file holds exactly one literal assignment.
    type: str
    default: ""
  model_bytes: {description: "Model size, for the start timeout.", type: int, default: 0}
  load_bytes_per_s: {description: Expected load rate., type: float, default: 1000000000}
  base_seconds: {description: Start-up time besides loading., type: int, default: 180}
  cache_dir:
    description:
      - The unit's writable cache folder (its only ReadWritePaths entry). Every cache vLLM and its kernel
        libraries write at run time (HOME, XDG_CACHE_HOME, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR,
        VLLM_CACHE_ROOT, CUDA_CACHE_PATH, FLASHINFER_WORKSPACE_BASE, ...) is pointed inside it.
    type: str
    required: true
  allowed_networks:
    description:
      - Networks the server may exchange traffic with besides loopback (IPAddressAllow=; everything else is
        denied). Required when I(host) is not loopback.
    type: list
    elements: str
    default: []
  served_aliases:
    description:
      - More names the server answers to, after the profile's C(served_model_name) (vllm_service_served_aliases),
        such as a fleet endpoint's model name, which stays the same when its group switches to another model.
      - Each is 1-63 letters, digits, '.', '_' or '-'; an alias equal to the profile's name or given twice is
        served once.
    type: list
    elements: str
    default: []
  group_member:
    description:
      - This host's entry of a multi-host group (one of the C(group_members) filter's entries; issue 24), or
        omitted for a single-host server. The member's vLLM arguments are added, its environment
        (C(VLLM_HOST_IP), the socket interfaces) set, its peers' addresses allowed, and the server started
        through I(launcher).
    type: dict
  launcher:
    description: Absolute path of modelfleet-vllm-serve.py on the host (required with I(group_member)).
    type: str
  extra_environment:
    description:
      - More variables for the server (vllm_service_environment). Names must match [A-Za-z_][A-Za-z0-9_]*,
        values must be one line, and the cache and offline variables modelfleet sets cannot be overridden.
    type: dict
    default: {}
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Compute the unit
  modelfleet.fleet.vllm_unit:
    python: /opt/modelfleet/vllm/bin/python
    model_dir: "{{ hf_fetch_outcome.model_dir }}"
    revision: "{{ hf_fetch_outcome.revision }}"
    profile: "{{ __profile.profile }}"
    plan: "{{ __plan.plan }}"
"""

RETURN = r"""
argv: {description: The server command line., returned: success, type: list, elements: str}
exec_start: {description: "argv quoted for systemd, one element per line in the unit.", returned: success, type: list, elements: str}
unit: {description: The unit name., returned: success, type: str}
served_names: {description: "The names the server answers to: the profile's first, then each alias.", returned: success, type: list, elements: str}
unit_path: {description: Where the unit file is installed., returned: success, type: str}
timeout_start_seconds: {description: TimeoutStartSec and the readiness budget., returned: success, type: int}
command_line: {description: The command as one shell-readable line (shown in check/diff mode)., returned: success, type: str}
cache_dir: {description: "The writable cache folder, normalised (ReadWritePaths and WorkingDirectory).", returned: success, type: str}
environment: {description: "Every variable the unit sets, in order.", returned: success, type: dict}
environment_lines: {description: "The Environment= values, quoted by systemd's rules.", returned: success, type: list, elements: str}
read_only_paths: {description: "The ReadOnlyPaths= value (the model folder, quoted by systemd's rules).", returned: success, type: str}
read_write_paths: {description: The ReadWritePaths= value (the cache folder)., returned: success, type: str}
ip_address_allow: {description: "IPAddressAllow= entries (loopback, allowed_networks, a group member's peers).", returned: success, type: list, elements: str}
group_role: {description: "head or headless for a group member; single otherwise.", returned: success, type: str}
compile_cache_key:
  description: >-
    What a compile cache made by this server is valid for (vLLM version and command line less the listener and
    the served names); null when vLLM is not installed yet.
  returned: success
  type: str
compile_cache_dirs: {description: The cache folders that hold compiled code (what travels between hosts)., returned: success, type: list, elements: str}
"""

import shlex

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import (
    COMPILE_CACHE_DIRS,
    allowed_networks,
    check_api_key,
    compile_cache_key,
    environment_assignment,
    exec_lines,
    path_setting,
    served_names,
    server_argv,
    start_timeout_seconds,
    unit_environment,
    unit_name,
    unit_path,
    vllm_version,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "str", "required": True},
            "model_dir": {"type": "str", "required": True},
            "profile": {"type": "dict", "required": True},
            "plan": {"type": "dict"},
            "host": {"type": "str", "default": "127.0.0.1"},
            "port": {"type": "int", "default": 8000},
            "revision": {"type": "str"},
            "gpu_count": {"type": "int"},
            "api_key_set": {"type": "bool", "default": False},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "model_bytes": {"type": "int", "default": 0},
            "load_bytes_per_s": {"type": "float", "default": 1e9},
            "base_seconds": {"type": "int", "default": 180},
            "cache_dir": {"type": "str", "required": True},
            "extra_environment": {"type": "dict", "default": {}},
            "served_aliases": {"type": "list", "elements": "str", "default": []},
            "allowed_networks": {"type": "list", "elements": "str", "default": []},
            "group_member": {"type": "dict"},
            "launcher": {"type": "str"},
        },
        supports_check_mode=True,
    )
    p = module.params
    member = p["group_member"] or None
    try:
        argv = server_argv(python=p["python"], model_dir=p["model_dir"], profile=p["profile"], plan=p["plan"],
                           host=p["host"], port=p["port"], revision=p["revision"], gpu_count=p["gpu_count"],
                           api_key_set=p["api_key_set"], aliases=p["served_aliases"], member=member,
                           launcher=p["launcher"])
        names = served_names(p["profile"]["served_model_name"], p["served_aliases"])
        unit = unit_name(p["profile"]["served_model_name"])
        path = unit_path(p["profile"]["served_model_name"])
        timeout = start_timeout_seconds(p["model_bytes"], p["load_bytes_per_s"], p["base_seconds"])
        check_api_key(p["api_key"])
        env = unit_environment(p["cache_dir"], {**p["extra_environment"], **((member or {}).get("environment") or {})})
        env_lines = [environment_assignment(k, v) for k, v in env.items()]
        exec_start = exec_lines(argv)
        ro_paths = path_setting(p["model_dir"], "model folder")
        rw_paths = path_setting(env["HOME"], "cache folder")
        # a member reaches its peers (and they it) on the group's addresses, its own included (the head's worker
        # joins the store it serves on its own group address); nothing else beyond the listener's networks
        group_addrs = [member["address"], *member.get("peers", [])] if member else []
        ip_allow = allowed_networks(p["host"], p["allowed_networks"] + [a for a in dict.fromkeys(group_addrs) if a])
        cache_key = compile_cache_key(argv, vllm_version(p["python"]))
    except (ModelfleetError, KeyError) as e:
        module.fail_json(msg=f"vllm_unit: {e}")
    module.exit_json(changed=False, argv=argv, exec_start=exec_start, unit=unit, unit_path=path, served_names=names,
                     timeout_start_seconds=timeout, command_line=" ".join(shlex.quote(a) for a in argv),
                     cache_dir=env["HOME"], environment=env, environment_lines=env_lines,
                     read_only_paths=ro_paths, read_write_paths=rw_paths, ip_address_allow=ip_allow,
                     compile_cache_key=cache_key, compile_cache_dirs=list(COMPILE_CACHE_DIRS),
                     group_role=(member or {}).get("role", "single"))


if __name__ == "__main__":
    main()
