#!/usr/bin/python
"""Ansible module shell: resolve a hub revision to its commit and build the lock (fetch.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_lock
short_description: Resolve a Hugging Face revision to a 40-hex commit and list every file with size and checksum
description:
  - Through huggingface_hub, resolves O(revision) (branch, tag or commit) to its commit and returns the
    lock, every selected file's name, size, sha256 (LFS files) and git blob id, and the host paths the
    model will have. A moving branch is never what gets served, the commit is.
  - Read-only; check mode returns the same lock.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  repo_id: {description: Hub repo id (org/name)., type: str, required: true}
  revision: {description: "Branch, tag or commit.", type: str, default: main}
  allow_patterns: {description: Glob patterns of files to fetch (default all)., type: list, elements: str, default: []}
  root: {description: Models root (to return the paths)., type: path, required: true}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - modelfleet.fleet.modelfleet.hub_access
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
"""

EXAMPLES = r"""
- name: Resolve and lock
  modelfleet.fleet.hf_lock:
    repo_id: moonshotai/Kimi-K2.5
    revision: main
    root: /models
  register: __lock
"""

RETURN = r"""
lock: {description: 'repo_id, requested_revision, revision (40-hex), total_bytes, files (name, size, sha256, blob_id)', returned: success, type: dict}
paths: {description: "final, staging, status paths on the host.", returned: success, type: dict}
complete: {description: Whether the final directory is already complete for this commit., returned: success, type: bool}
"""


from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.arg_specs import HUB_ACCESS
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import (
    build_lock,
    hub_listing,
    is_complete,
    model_paths,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.secrets import read_secret_file


def read_token(module, path):
    if not path:
        return None
    try:
        return read_secret_file(path, "token file") or None
    except ModelfleetError as e:
        module.fail_json(msg=f"hf_lock: {e}")


def main():
    module = AnsibleModule(
        argument_spec={
            **HUB_ACCESS,
            "repo_id": {"type": "str", "required": True},
            "revision": {"type": "str", "default": "main"},
            "allow_patterns": {"type": "list", "elements": "str", "default": []},
            "root": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    token = read_token(module, p["token_file"])
    try:
        commit, files = hub_listing(p["repo_id"], p["revision"], p["endpoint"], token)
        lock = build_lock(p["repo_id"], p["revision"], commit, files, p["allow_patterns"], p["endpoint"])
        paths = model_paths(p["root"], p["repo_id"], commit)
    except ModelfleetError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, lock=lock, paths=paths, complete=is_complete(paths["final"], commit))


if __name__ == "__main__":
    main()
