"""Lookup plugin: where a model's files live on a host - the one layout rule (module_utils fetch.model_paths),
which the hf_lock module also returns."""

from __future__ import annotations

DOCUMENTATION = r"""
name: model_paths
short_description: A model's folders on a host (final, staging, status) under a models root
description:
  - The layout C(hf_lock) returns as C(paths), for playbooks that know the repo and the 40-hex commit but did
    not call it (a local source's lock, the controller's plan, the fan-out relay) - one rule
    (plugins/module_utils/modelfleet/fetch.py, model_paths), never re-derived in Jinja.
  - Pure string work on the controller; nothing is read or created.
options:
  _terms:
    description: The repo id (org/name) and the 40-hex commit.
    required: true
  root:
    description: The models root (or any folder that holds models by this layout).
    type: path
    required: true
"""

EXAMPLES = r"""
- name: The model's final folder on this host
  ansible.builtin.debug:
    msg: "{{ lookup('modelfleet.fleet.model_paths', 'moonshotai/Kimi-K2.5', revision, root=modelfleet_models_root).final }}"
"""

RETURN = r"""
_raw:
  description: One mapping - final, staging, status, lock, meta.
  type: list
  elements: dict
"""


from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase


def _fetch():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import fetch

    return fetch


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if len(terms) != 2:
            raise AnsibleLookupError(f"model_paths: give the repo id and the 40-hex commit, got {list(terms)!r}")
        fetch = _fetch()
        repo_id, commit = (str(t) for t in terms)
        try:
            return [fetch.model_paths(self.get_option("root"), repo_id, commit)]
        except fetch.ModelfleetError as e:
            raise AnsibleLookupError(f"model_paths: {e}") from None
