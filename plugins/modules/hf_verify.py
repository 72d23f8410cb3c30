#!/usr/bin/python
"""Ansible module shell over module_utils model_verify.verify_model: verify a received tree against the lock and
finalize it (fan-out targets)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_verify
short_description: Verify a model tree against its lock (size and sha256 of every file) and mark it complete
description:
  - Used on fan-out targets, which receive the files from the seed host and never contact the hub,
    and to re-verify a complete model. Fails naming the first bad file with expected and actual values;
    only a fully verified tree is moved into place and marked complete.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  source: {description: 'Directory holding the received files (default: the staging path).', type: path}
  finalize: {description: Move into place and write the completion marker., type: bool, default: true}
  level: {description: 'For an already complete model: size (cheap) or full (sha256 of every file).', type: str, choices: [size, full], default: full}
  reopen_bad:
    description: >-
      If a complete model fails, take it back to staging (marker removed) so only the bad files are fetched again,
      instead of failing.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - modelfleet.fleet.modelfleet.model_files
  - modelfleet.fleet.modelfleet.ownership
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
"""

EXAMPLES = r"""
- name: Verify what the seed sent
  modelfleet.fleet.hf_verify:
    root: /models
    lock: "{{ __lock.lock }}"
"""

RETURN = r"""
verify: {description: 'ok, bad, bytes_hashed, seconds, mb_per_s.', returned: always, type: dict}
final: {description: The model directory., returned: success, type: str}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.arg_specs import MODEL_FILES, OWNERSHIP
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import owner_ids
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.model_verify import VerifyError, verify_model


def main():
    module = AnsibleModule(
        argument_spec={
            **MODEL_FILES,
            **OWNERSHIP,
            "source": {"type": "path"},
            "finalize": {"type": "bool", "default": True},
            "level": {"type": "str", "choices": ["size", "full"], "default": "full"},
            "reopen_bad": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        owner = owner_ids(p["owner"], p["group"])
        res = verify_model(root=p["root"], lock=p["lock"], source=p["source"], finalize_tree=p["finalize"],
                           level=p["level"], reopen_bad=p["reopen_bad"], owner=owner, check_mode=module.check_mode)
    except VerifyError as e:
        module.fail_json(msg=str(e), **e.details)
    except (ModelfleetError, OSError, KeyError) as e:
        module.fail_json(msg=str(e))
    module.exit_json(**res)


if __name__ == "__main__":
    main()
