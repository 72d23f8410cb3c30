"""Lookup plugin: modelfleet's state folder on the controller, or a path under it."""

from __future__ import annotations

DOCUMENTATION = r"""
name: state_dir
short_description: modelfleet's state folder on the controller (or a path under it)
description:
  - C($MODELFLEET_STATE_DIR), else C(~/.local/state/modelfleet), the rule the runner uses for its run folders
    (plugins/module_utils/modelfleet/controller_paths.py); the terms are joined under it.
options:
  _terms:
    description: Path parts under the state folder (none for the folder itself).
    required: false
"""

EXAMPLES = r"""
- name: Where compile-cache archives go
  ansible.builtin.debug:
    msg: "{{ lookup('modelfleet.fleet.state_dir', 'compile-cache') }}"
"""

RETURN = r"""
_raw:
  description: One path.
  type: list
  elements: str
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase


def _controller_paths():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import controller_paths

    return controller_paths


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        parts = [str(t) for t in terms]
        for p in parts:
            if not p or p.startswith("/") or ".." in p.split("/"):
                raise AnsibleLookupError(f"state_dir: {p!r} is not a relative path under the state folder")
        return [os.path.join(_controller_paths().state_dir(), *parts)]
