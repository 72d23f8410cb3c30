"""Lookup plugin: one sha256 over the files under the given folders (path and bytes of each, sorted)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: code_digest
short_description: A digest of the controller's code (roles, plugins, playbooks) for the deploy record
description:
  - Walks each folder given (default - the C(roles), C(plugins) and C(playbooks) folders of the checkout this
    plugin lives in), skipping C(__pycache__) and C(*.pyc), and returns one sha256 over every file's
    path relative to its folder and its bytes, in sorted order. A deploy record made by other code than the
    code running now no longer counts as current, so a changed role takes the full path once.
options:
  _terms: {description: "Folders (default the checkout's roles, plugins and playbooks).", required: false, type: list, elements: path}
"""

EXAMPLES = r"""
- name: Digest of the code
  ansible.builtin.set_fact:
    code: "{{ lookup('modelfleet.fleet.code_digest') }}"
"""

RETURN = r"""
_raw: {description: One hex sha256., type: list, elements: str}
"""

import hashlib
import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase


def tree_digest(folders) -> str:
    h = hashlib.sha256()
    for folder in folders:
        if not os.path.isdir(folder):
            raise AnsibleLookupError(f"code_digest: {folder} is not a folder")
        files = []
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            files += [os.path.join(dirpath, f) for f in filenames if not f.endswith(".pyc")]
        for path in sorted(files):
            h.update(os.path.relpath(path, folder).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_FOLDERS = [os.path.join(CHECKOUT, d) for d in ("roles", "plugins", "playbooks")]


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        folders = [os.path.abspath(os.path.expanduser(str(t))) for t in terms] or DEFAULT_FOLDERS
        return [tree_digest(folders)]
