#!/usr/bin/python
"""Ansible module shell over module_utils peer: pull a verified model from other hosts of the fleet (peer
distribution), then mark it complete."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_peer_pull
short_description: Pull a model from peer hosts file by file, each file verified before it is served onwards
description:
  - Peer distribution (hf_fetch_fanout_via peer). With O(phase=pull) the host pulls every locked file into its
    staging folder from the first live source in O(sources), with rsync over SSH; each file is checked against
    the lock's digest before it is renamed into staging, and only such files are listed in the host's status
    file, which is what its own children read. A source that fails, stalls or serves a file that does not
    match the lock is dropped and the next one is used. A killed pull continues from the verified files.
    Each file is hashed while the next one moves, and a source's status is read again only for a file its last
    read did not list.
  - With O(phase=finalize) the pulled tree is marked complete from the digests recorded as the files arrived
    (a file without a valid record is hashed again); run it once every host's pull has ended.
  - The controller carries no model bytes. The SSH access between hosts is set up and removed by the
    hf_fetch role (keys made for the transfer, a read-only rrsync forced command).
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  phase: {description: 'pull (receive the files) or finalize (mark the tree complete).', type: str, choices: [pull, finalize], default: pull}
  sources:
    description:
      - 'The hosts to pull from, tried in order: each a dict with host (name), address (empty: a local folder),
        port, user, root (the source''s models root), complete (true for the origin''s finished tree).'
    type: list
    elements: dict
    default: []
  key: {description: Private key for SSH to the sources., type: path}
  known_hosts: {description: 'known_hosts file with the sources'' host keys (strict checking).', type: path}
  control_dir:
    description: >-
      Folder for SSH control sockets (three shared connections per source: status reads, and two for the sessions
      that move files). At most 47 bytes.
    type: path
  poll_seconds: {description: How often a source's progress is read while waiting for a file., type: float, default: 1}
  stall_seconds: {description: A source whose progress does not change for this long is dropped., type: float, default: 120}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - modelfleet.fleet.modelfleet.model_files
  - modelfleet.fleet.modelfleet.ownership
attributes:
  platform:
    platforms: posix
  check_mode: {support: none}
  diff_mode: {support: none}
"""

EXAMPLES = r"""
- name: Pull from the parent, then its ancestors
  modelfleet.fleet.hf_peer_pull:
    root: /models
    lock: "{{ __lock.lock }}"
    sources:
      - {host: gpu-1, address: 10.0.0.11, port: 22, user: modelfleet-peer, root: /models, complete: true}
    key: /run/modelfleet-peer/key
    known_hosts: /run/modelfleet-peer/known_hosts
  async: 86400
  poll: 0
"""

RETURN = r"""
pull: {description: 'Pull figures: files, bytes, bytes_moved, kept, seconds, bytes_per_s, sources, dropped.', returned: phase pull, type: dict}
final: {description: The model directory., returned: phase finalize, type: str}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.arg_specs import MODEL_FILES, OWNERSHIP
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import (
    ModelWriteLock,
    is_complete,
    model_paths,
    owner_ids,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.peer import finalize_recorded, pull


def main():
    module = AnsibleModule(
        argument_spec={
            **MODEL_FILES,
            **OWNERSHIP,
            "phase": {"type": "str", "choices": ["pull", "finalize"], "default": "pull"},
            "sources": {"type": "list", "elements": "dict", "default": []},
            "key": {"type": "path"},
            "known_hosts": {"type": "path"},
            "control_dir": {"type": "path"},
            "poll_seconds": {"type": "float", "default": 1.0},
            "stall_seconds": {"type": "float", "default": 120.0},
        },
        supports_check_mode=False,
    )
    p = module.params
    try:
        paths = model_paths(p["root"], p["lock"]["repo_id"], p["lock"]["revision"])
        if is_complete(paths["final"], p["lock"]["revision"]):
            nothing = {"files": len(p["lock"]["files"]), "bytes": p["lock"]["total_bytes"], "bytes_moved": 0,
                       "kept": len(p["lock"]["files"]), "seconds": 0.0, "bytes_per_s": 0.0, "sources": [],
                       "dropped": []}
            module.exit_json(changed=False, final=paths["final"], msg="already complete",
                             **({"pull": nothing} if p["phase"] == "pull" else {}))
        ModelWriteLock(paths).acquire()
        if p["phase"] == "finalize":
            res = finalize_recorded(root=p["root"], lock=p["lock"], owner=owner_ids(p["owner"], p["group"]))
            module.exit_json(changed=True, **res)
        ssh = {k: p[k] for k in ("key", "known_hosts", "control_dir") if p[k]}
        sources = [{**s, "ssh": ssh} for s in p["sources"]]
        res = pull(root=p["root"], lock=p["lock"], sources=sources, poll_seconds=p["poll_seconds"],
                   stall_seconds=p["stall_seconds"], log=module.warn)
    except (ModelfleetError, KeyError) as e:
        module.fail_json(msg=f"hf_peer_pull: {e}")
    except OSError as e:
        module.fail_json(msg=f"hf_peer_pull: writing under {p['root']} failed: {e} (no space? unwritable target?); "
                             "nothing was marked complete")
    module.exit_json(changed=res["bytes_moved"] > 0, pull=res)


if __name__ == "__main__":
    main()
