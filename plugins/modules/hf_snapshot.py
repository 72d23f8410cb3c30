#!/usr/bin/python
"""Ansible module shell over module_utils snapshot.fetch_snapshot: download a locked snapshot with a stall watchdog,
verify, move into place."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_snapshot
short_description: Download a locked model snapshot, verify every file, and only then mark it complete
description:
  - Downloads the files of O(lock) with huggingface_hub C(snapshot_download) (max_workers, the
    lock's file list as allow_patterns, the pinned commit) into the staging directory, in a child
    process watched for stalls (no new bytes for O(stall_seconds) restarts it; more than O(max_stalls)
    restarts fails). Progress goes to a JSON status file on the host.
  - Verifies every file's size and sha256 (git blob id for small non-LFS files) against the lock; a
    mismatch re-fetches that file once, then fails naming the file with expected and actual values.
  - Moves the verified tree into place atomically and writes the completion marker last.
  - Meant to run as an Ansible async job, detached from the connection. A rerun after an interruption
    keeps completed files (huggingface_hub does not resume a partial file across processes, so at most
    max_workers partial files are fetched again).
  - One writer per model. The module holds an exclusive lock on
    C(<root>/.status/<org>--<name>@<commit>.lock) for as long as it (and its download child) runs, so a
    second fetch of the same commit, for example a rerun while an earlier run's detached job is still
    downloading, fails at once with that job's pid and progress and changes nothing. The kernel releases
    the lock when the holder dies, so a killed fetch never leaves a stale lock.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  max_workers: {description: Parallel file downloads., type: int, default: 8}
  stall_seconds: {description: Seconds without new bytes before the transfer is restarted., type: float, default: 120}
  max_stalls: {description: Restarts allowed before failing., type: int, default: 3}
  verify_existing:
    description: 'Re-check a complete model: none, size (cheap), or full (sha256 of every file); a bad file is fetched again.'
    type: str
    choices: [none, size, full]
    default: size
  xet:
    description:
      - Let huggingface_hub take the hub's Xet transfer path (hf_xet) for Xet-backed files. Off by default; the hub
        then serves the same files over its classic HTTP path, the one the stall watchdog, resume and
        verification are tested on.
      - On, the Xet chunk cache goes to C(.cache/xet) in the staging folder (on the models root, removed when the
        model is complete), limited to O(xet_cache_bytes), which the disk plan reserves.
    type: bool
    default: false
  xet_cache_bytes: {description: "The Xet chunk cache's size limit in bytes (required, positive, with O(xet=true)).", type: int, default: 0}
  xet_high_performance: {description: "Xet's high-throughput mode (HF_XET_HIGH_PERFORMANCE), with O(xet=true).", type: bool, default: false}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - modelfleet.fleet.modelfleet.model_files
  - modelfleet.fleet.modelfleet.hub_access
  - modelfleet.fleet.modelfleet.ownership
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
"""

EXAMPLES = r"""
- name: Fetch (detached)
  modelfleet.fleet.hf_snapshot:
    root: /models
    lock: "{{ __lock.lock }}"
  async: 86400
  poll: 0
"""

RETURN = r"""
final: {description: The model directory., returned: success, type: str}
bytes: {description: Bytes in the model., returned: success, type: int}
verify: {description: 'Verification figures: bytes_hashed, seconds, mb_per_s, refetched.', returned: success, type: dict}
download:
  description: >-
    attempts, stalls, seconds, bytes_per_s, and transfer (xet, xet_cache, xet_chunk_cache_bytes - what the download
    child's hub client was set to do).
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.arg_specs import (
    HUB_ACCESS,
    MODEL_FILES,
    OWNERSHIP,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import owner_ids
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.secrets import read_secret_file
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.snapshot import (
    VERIFY_EXISTING,
    fetch_snapshot,
)


def main():
    module = AnsibleModule(
        argument_spec={
            **MODEL_FILES,
            **HUB_ACCESS,
            **OWNERSHIP,
            "max_workers": {"type": "int", "default": 8},
            "stall_seconds": {"type": "float", "default": 120},
            "max_stalls": {"type": "int", "default": 3},
            "verify_existing": {"type": "str", "choices": list(VERIFY_EXISTING), "default": "size"},
            "xet": {"type": "bool", "default": False},
            "xet_cache_bytes": {"type": "int", "default": 0},
            "xet_high_performance": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    token = None
    if p["token_file"]:
        try:
            token = read_secret_file(p["token_file"], "token file") or None
        except ModelfleetError as e:
            module.fail_json(msg=f"hf_snapshot: {e}")
    try:
        owner = None if module.check_mode else owner_ids(p["owner"], p["group"])
        res = fetch_snapshot(root=p["root"], lock=p["lock"], endpoint=p["endpoint"], token=token, owner=owner,
                             max_workers=p["max_workers"], stall_seconds=p["stall_seconds"],
                             max_stalls=p["max_stalls"], verify_existing=p["verify_existing"],
                             check_mode=module.check_mode, xet=p["xet"], xet_cache_bytes=p["xet_cache_bytes"],
                             xet_high_performance=p["xet_high_performance"])
    except (ModelfleetError, KeyError) as e:
        module.fail_json(msg=str(e))
    except OSError as e:
        module.fail_json(msg=f"fetch failed writing under {p['root']}: {e} (no space? unwritable target?); "
                             "nothing was marked complete")
    module.exit_json(**res)


if __name__ == "__main__":
    main()
