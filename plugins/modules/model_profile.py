#!/usr/bin/python
"""Ansible module shell over modelfleet's profile schema (plugins/module_utils/modelfleet/profiles.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_profile
short_description: Validate a modelfleet model profile and return it with defaults filled
description:
  - Checks a profile (the YAML data under C(profiles/)) against modelfleet's schema and returns it
    normalised. A bad profile fails with one line naming the field and the fix.
  - Read-only; check mode returns the same result.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  profile:
    description: The profile data (for example loaded with C(ansible.builtin.include_vars)).
    type: dict
    required: true
  source:
    description: Where the data came from, for error messages (a path ending in C(.yml) also checks the name).
    type: str
    default: profile
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
- name: Validate the profile
  modelfleet.fleet.model_profile:
    profile: "{{ lookup('ansible.builtin.file', 'profiles/kimi-k2.5-int4.yml') | from_yaml }}"
    source: profiles/kimi-k2.5-int4.yml
  register: __profile
"""

RETURN = r"""
profile:
  description: The validated profile with defaults filled in.
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.profiles import validate_profile


def main():
    module = AnsibleModule(
        argument_spec={"profile": {"type": "dict", "required": True}, "source": {"type": "str", "default": "profile"}},
        supports_check_mode=True,
    )
    try:
        profile = validate_profile(module.params["profile"], module.params["source"])
    except ModelfleetError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, profile=profile)


if __name__ == "__main__":
    main()
