#!/usr/bin/python
"""Ansible module: check or write the host's deploy record (the unchanged-host fast path)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deploy_record
short_description: Check whether a host already serves exactly what a deploy asks for, or record that it does
description:
  - With O(state=check), reads the record at O(path) and reports C(current=true) only when the digest of
    the deploy's inputs (O(inputs_digest)) equals the recorded one, the unit file, its environment file and the venv's packages are the
    recorded ones, the model's completion marker and commit are there and its files have their locked sizes,
    the unit is active with no other modelfleet vLLM unit active, and the server is ready (health, model
    listed, one real completion). Otherwise C(reasons) says what differs. Read-only.
  - With O(state=present), writes the record (root only, atomically) of what serves now, measuring the file
    digests at this moment; changed only when its content differs.
  - Only the digest of the inputs reaches the host; compute it on the controller, where the inputs (which
    may hold a token or an API key) stay.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  state: {description: check or present., type: str, choices: [check, present], required: true}
  path: {description: 'The record file, e.g. /var/lib/modelfleet/deployed/<served-name>.json.', type: path, required: true}
  inputs_digest:
    description: >-
      sha256 (hex) of everything the deploy asks of this host - profile, revision, plan, driver, code digest, role
      variables - from the filter C(deploy_inputs_digest) (module_utils deploy_record.inputs_digest).
    type: str
    required: true
  readiness: {description: "With state=check, also look at the server once (health, model listed, one completion).", type: bool, default: true}
  unit: {description: The unit (state=present)., type: str}
  unit_path: {description: The installed unit file (state=present)., type: path}
  env_file: {description: The unit's environment file (state=present)., type: path}
  model_dir: {description: The served model directory (state=present)., type: path}
  venv: {description: The vLLM venv (state=present)., type: path}
  url: {description: The server's base URL (state=present)., type: str}
  served_name: {description: The served model name (state=present)., type: str}
  summary: {description: "What the record is of, for people (profile, revision).", type: dict, default: {}}
  outcome: {description: "The outcome to replay on the fast path (fetch, environment, unit, benchmark).", type: dict, default: {}}
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Is this host already serving exactly this
  modelfleet.fleet.deploy_record:
    state: check
    path: /var/lib/modelfleet/deployed/kimi-k2.5.json
    inputs_digest: "{{ deploy_inputs | modelfleet.fleet.deploy_inputs_digest }}"
  register: record
"""

RETURN = r"""
current: {description: The host serves exactly what the inputs ask for (state=check)., returned: always, type: bool}
reasons: {description: Why it is not current., returned: always, type: list}
readiness: {description: "The readiness look (stage, detail) when it was made.", returned: always, type: dict}
record: {description: 'The record (summary, unit, url, served_name, model_dir, outcome), state=check.', returned: always, type: dict}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.deploy_record import (
    build_record,
    check,
    write_record,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.readiness import look

PRESENT_NEEDS = ["unit", "unit_path", "env_file", "model_dir", "venv", "url", "served_name"]


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["check", "present"], "required": True},
            "path": {"type": "path", "required": True},
            "inputs_digest": {"type": "str", "required": True},
            "readiness": {"type": "bool", "default": True},
            "unit": {"type": "str"},
            "unit_path": {"type": "path"},
            "env_file": {"type": "path"},
            "model_dir": {"type": "path"},
            "venv": {"type": "path"},
            "url": {"type": "str"},
            "served_name": {"type": "str"},
            "summary": {"type": "dict", "default": {}},
            "outcome": {"type": "dict", "default": {}},
        },
        required_if=[("state", "present", PRESENT_NEEDS)],
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["state"] == "check":
            res = check(p["path"], p["inputs_digest"], probe=look if p["readiness"] else None)
            module.exit_json(changed=False, **res)
        record = build_record(inputs_digest=p["inputs_digest"], summary=p["summary"], outcome=p["outcome"],
                              **{k: p[k] for k in PRESENT_NEEDS})
        changed = write_record(p["path"], record, check_mode=module.check_mode)
        module.exit_json(changed=changed, current=True, reasons=[], readiness={},
                         record={"summary": record["summary"], "unit": record["unit"], "url": record["url"]})
    except ModelfleetError as e:
        module.fail_json(msg=str(e))


if __name__ == "__main__":
    main()
