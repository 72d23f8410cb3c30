#!/usr/bin/python
"""Ansible module shell over modelfleet's rollout planner (plugins/module_utils/modelfleet/rollout.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rollout_plan
short_description: The waves and batches of a deploy, and each host's profile, from the fleet file
description:
  - Given the hosts a deploy targets (after C(--limit)) with the profile each one's fleet group declares, and
    the fleet file's rollout (C(modelfleet_rollout)), returns the waves in the file's order, each cut into
    batches by its own C(serial), the batch sizes the deploy's plays run with, each host's profile and wave,
    and the origin of each model (the host that takes it from the hub).
  - A plain inventory (no rollout) has two waves, the C(canary) group and the rest at O(default_serial).
  - A named O(profile) narrows the run to the hosts that declare it; hosts that declare none take it.
  - Pure computation; check mode returns the same plan.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  declared:
    description: Host name to the profile its fleet group declares (null for none), in the order Ansible lists
      the targeted hosts.
    type: dict
    required: true
  rollout:
    description: The fleet file's rollout (C(waves), C(max_fail_percentage)), as the fleet inventory plugin
      publishes it in C(modelfleet_rollout); omitted for a plain inventory.
    type: dict
  canary:
    description: The hosts of the C(canary) group (used when there is no rollout).
    type: list
    elements: str
    default: []
  profile:
    description: A profile named on the command line.
    type: str
  default_serial:
    description: Hosts per batch after the canary when there is no rollout (a number, or a percentage such as
      C(25%)); omitted means all at once.
    type: raw
  default_max_fail_percentage:
    description: The failed share of a batch that stops the rollout when there is no rollout.
    type: int
    default: 0
  serving:
    description: Host name to its multi-host replica (C(modelfleet_serving_group), as the fleet inventory plugin
      publishes it; null for a host that serves alone). A replica's hosts go into one batch (C(serial) counts
      replicas), and a run that targets some of its hosts but not all is refused.
    type: dict
    default: {}
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
- name: Plan the rollout
  modelfleet.fleet.rollout_plan:
    declared: {gpu-01: kimi-k2.5-int4, gpu-02: kimi-k2.5-int4, gpu-03: minimax-m2.5}
    rollout: "{{ modelfleet_rollout | default(omit) }}"
  register: __plan
"""

RETURN = r"""
plan:
  description: waves (name, index, canary, serial, max_fail_percentage, batches, profiles, replicas - the
    multi-host replicas of the wave), text (one line per wave and per batch), host_profile, profiles, left_out
    (targeted hosts serving another profile), canary_hosts, canary_serial, rest_hosts, rest_serial (batch sizes
    in order), max_fail_percentage, wave_of (host to wave, wave_number, batch, batches), origins (profile to the
    host that takes it from the hub), profile_hosts (profile to its hosts in the rollout's order).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.rollout import deploy_plan


def main():
    module = AnsibleModule(
        argument_spec={
            "declared": {"type": "dict", "required": True},
            "rollout": {"type": "dict"},
            "canary": {"type": "list", "elements": "str", "default": []},
            "profile": {"type": "str"},
            "default_serial": {"type": "raw"},
            "default_max_fail_percentage": {"type": "int", "default": 0},
            "serving": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    p = module.params
    serial = p["default_serial"]
    if isinstance(serial, str) and serial.isdigit():
        serial = int(serial)
    try:
        result = deploy_plan(p["declared"], p["rollout"], p["canary"], p["profile"] or None, serial,
                             p["default_max_fail_percentage"], serving=p["serving"])
    except ModelfleetError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, plan=result)


if __name__ == "__main__":
    main()
