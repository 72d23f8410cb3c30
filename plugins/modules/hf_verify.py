#!/usr/bin/python
"""Ansible module shell: verify a received tree against the lock and finalize it (fan-out targets)."""

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
author: modelfleet
options:
  root: {description: Models root., type: path, required: true}
  lock: {description: The lock from hf_lock., type: dict, required: true}
  source: {description: 'Directory holding the received files (default: the staging path).', type: path}
  finalize: {description: Move into place and write the completion marker., type: bool, default: true}
  level: {description: 'For an already complete model: size (cheap) or full (sha256 of every file).', type: str, choices: [size, full], default: full}
  reopen_bad: {description: 'If a complete model fails, take it back to staging (marker removed) so only the bad files are fetched again, instead of failing.', type: bool, default: false}
  owner: {description: Owner of the final files., type: str, default: root}
  group: {description: Group of the final files., type: str, default: root}
attributes:
  check_mode: {support: full}
  diff_mode: {support: none}
"""

EXAMPLES = r"""
- name: Verify what the seed sent
  hf_verify:
    root: /models
    lock: "{{ __lock.lock }}"
"""

RETURN = r"""
verify: {description: 'ok, bad, bytes_hashed, seconds, mb_per_s.', returned: always, type: dict}
final: {description: The model directory., returned: success, type: str}
"""

import grp
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.modelfleet.errors import ModelfleetError
from ansible.module_utils.modelfleet.fetch import (
    ModelWriteLock,
    finalize,
    is_complete,
    model_paths,
    reopen_complete,
    verify_tree,
)


def reopen_check(paths, lock):
    import os

    bad = [{"name": e["name"], "ok": False, "reason": "missing or wrong size"} for e in lock["files"]
           if not os.path.isfile(os.path.join(paths["final"], e["name"]))
           or os.path.getsize(os.path.join(paths["final"], e["name"])) != e["size"]]
    return {"ok": not bad, "bad": bad, "bytes_hashed": 0, "seconds": 0, "mb_per_s": 0}


def main():
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "lock": {"type": "dict", "required": True},
            "source": {"type": "path"},
            "finalize": {"type": "bool", "default": True},
            "level": {"type": "str", "choices": ["size", "full"], "default": "full"},
            "reopen_bad": {"type": "bool", "default": False},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
        },
        supports_check_mode=True,
    )
    p = module.params
    lock = p["lock"]
    try:
        paths = model_paths(p["root"], lock["repo_id"], lock["revision"])
        if not module.check_mode and (p["reopen_bad"] or p["finalize"]):
            ModelWriteLock(paths).acquire()  # held until the module process ends
        if is_complete(paths["final"], lock["revision"]) and not p["source"]:
            if module.check_mode or not p["reopen_bad"]:
                v = verify_tree(paths["final"], lock) if p["level"] == "full" else reopen_check(paths, lock)
            else:
                v = reopen_complete(paths["final"], paths["staging"], lock, p["level"] == "full")
            if not v["ok"]:
                b = v["bad"][0]
                if p["reopen_bad"] and not module.check_mode:
                    module.exit_json(changed=True, reopened=True, final=paths["final"], verify=v,
                                     msg=f"{b['name']}: {b['reason']}; reopened for re-fetch")
                module.fail_json(msg=f"{paths['final']}/{b['name']}: {b['reason']}", verify=v)
            module.exit_json(changed=False, reopened=False, final=paths["final"], verify=v)
        src = p["source"] or paths["staging"]
        v = verify_tree(src, lock)
        if not v["ok"]:
            b = v["bad"][0]
            module.fail_json(msg=f"{src}/{b['name']}: {b['reason']} ({len(v['bad'])} bad file(s)); nothing was "
                                 "marked complete", verify=v)
        if module.check_mode or not p["finalize"]:
            module.exit_json(changed=False, final=paths["final"], verify=v)
        owner = (pwd.getpwnam(p["owner"]).pw_uid, grp.getgrnam(p["group"]).gr_gid)
        finalize(src, paths["final"], lock, owner)
    except (ModelfleetError, OSError, KeyError) as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=True, reopened=False, final=paths["final"], verify=v)


if __name__ == "__main__":
    main()
