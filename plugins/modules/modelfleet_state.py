#!/usr/bin/python
"""Ansible module: what this host serves and holds (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: modelfleet_state
short_description: Report a host's modelfleet state - vLLM units, served model and revision, models on disk, last benchmark
description:
  - Lists the modelfleet-vllm@*.service units with their served model name, state, main PID, restarts, and the
    model directory and port of their command line; for each, the repo and 40-hex revision from the model's
    lock file and whether it carries the completion marker. systemd is asked the one way modelfleet asks it
    (module_utils systemd); a systemctl that cannot be read fails the task with its error.
  - Lists the model directories under O(models_root) and the newest benchmark result under O(bench_dir).
  - Read-only; derived from the host, never from remembered variables.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  models_root: {description: The models root., type: path, default: /models}
  bench_dir: {description: Where the benchmark role leaves results on the host., type: path, default: /var/lib/modelfleet/bench}
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Read the state
  modelfleet.fleet.modelfleet_state:
    models_root: /models
  register: state
"""

RETURN = r"""
units:
  description: >-
    Every modelfleet vLLM unit: unit, served_model_name, active, state, main_pid, restarts, since, model_dir, port,
    and the lock's repo_id, revision, complete.
  returned: always
  type: list
serving: {description: The active ones., returned: always, type: list}
models: {description: Model directories on disk with revision and completeness., returned: always, type: list}
last_benchmark: {description: 'The newest benchmark result (path, headline, knee) or null.', returned: always, type: dict}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.host_state import host_state


def main():
    module = AnsibleModule(
        argument_spec={"models_root": {"type": "path", "default": "/models"},
                       "bench_dir": {"type": "path", "default": "/var/lib/modelfleet/bench"}},
        supports_check_mode=True,
    )
    try:
        state = host_state(module.params["models_root"], module.params["bench_dir"])
    except ModelfleetError as e:
        module.fail_json(msg=f"modelfleet_state: {e}")
    module.exit_json(changed=False, **state)


if __name__ == "__main__":
    main()
