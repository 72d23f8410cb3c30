#!/usr/bin/python
"""Ansible module: one bounded look at a vLLM server's readiness (health, model listed, a real completion)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_readiness
short_description: Wait a bounded time for a vLLM server to be really ready - health, model listed, one completion
description:
  - Polls for at most O(wait_seconds) - C(/health) answers 200, C(/v1/models) lists O(served_name), and one
    real completion of a few tokens succeeds - and returns the stage reached, the elapsed time and the last
    journal line of O(unit), so a play can print progress and call it again until its start budget is spent.
  - Reports C(unit_state) (active, activating, failed...) so a dead engine is seen at once, and stops waiting
    (C(dead)) when the server exited before it was ever ready more often than O(restarts_allowed) - a unit
    just started explicitly counts systemd's restarts from 0, and waiting through C(Restart=) only repeats
    the failure.
  - Read-only.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  unit: {description: The systemd unit (for its state and journal)., type: str}
  wait_seconds: {description: How long this call may wait., type: float, default: 15}
  prompt: {description: The completion prompt., type: str, default: Hello}
  max_tokens: {description: Tokens to generate., type: int, default: 4}
  restarts_allowed:
    description:
      - Automatic restarts of O(unit) tolerated before it is ready (0 - the first exit is a failed start).
      - Negative when the unit was not started by this run (its restart count is older history) - then only
        its failed state counts.
    type: int
    default: 0
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - modelfleet.fleet.modelfleet.server
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
"""

EXAMPLES = r"""
- name: Look once
  modelfleet.fleet.vllm_readiness:
    url: http://127.0.0.1:8000
    served_name: kimi-k2.5
    unit: modelfleet-vllm@kimi-k2.5.service
"""

RETURN = r"""
ready: {description: All three checks passed., returned: always, type: bool}
stage: {description: 'down, health, listed or ready.', returned: always, type: str}
detail: {description: What the last check said., returned: always, type: str}
journal_tail: {description: The unit's last journal line., returned: always, type: str}
unit_state: {description: The unit's ActiveState., returned: always, type: str}
dead: {description: 'The server died before it was ready (unit failed, or restarted more than allowed).', returned: always, type: bool}
dead_reason: {description: 'Why it counts as dead (empty when not).', returned: always, type: str}
restarts: {description: systemd's NRestarts for O(unit)., returned: always, type: int}
completion: {description: The completion text when ready., returned: when ready, type: str}
"""

import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.arg_specs import SERVER
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.readiness import (
    UNIT_PROPERTIES,
    look,
    restart_count,
    start_verdict,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.systemd import SystemdError, show_unit


def journal_tail(unit):
    jr = subprocess.run(["journalctl", "-u", unit, "-n", "1", "--no-pager", "-o", "cat"], capture_output=True,
                        text=True, check=False)
    return (jr.stdout.strip().splitlines() or [""])[-1][:300]


def main():
    module = AnsibleModule(
        argument_spec={
            **SERVER,
            "unit": {"type": "str"},
            "wait_seconds": {"type": "float", "default": 15},
            "prompt": {"type": "str", "default": "Hello"},
            "max_tokens": {"type": "int", "default": 4, "no_log": False},
            "restarts_allowed": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    p = module.params
    t0 = time.monotonic()
    while True:
        stage, detail, text = look(p["url"].rstrip("/"), p["served_name"], p["api_key"], p["prompt"], p["max_tokens"])
        try:
            props = show_unit(p["unit"], UNIT_PROPERTIES) if p["unit"] else {}
        except SystemdError as e:
            module.fail_json(msg=f"vllm_readiness: cannot read {p['unit']}'s state from systemd ({e})")
        dead, why = start_verdict(props, p["restarts_allowed"]) if p["unit"] and stage != "ready" else (False, "")
        if stage == "ready" or dead or time.monotonic() - t0 >= p["wait_seconds"]:
            break
        time.sleep(1)
    res = {"changed": False, "ready": stage == "ready", "stage": stage, "detail": detail,
           "unit_state": props.get("ActiveState", ""), "dead": dead, "dead_reason": why,
           "restarts": restart_count(props),
           "journal_tail": journal_tail(p["unit"]) if p["unit"] else "",
           "waited_seconds": round(time.monotonic() - t0, 1)}
    if text is not None:
        res["completion"] = text
    module.exit_json(**res)


if __name__ == "__main__":
    main()
