#!/usr/bin/python
"""Ansible module shell: download a locked snapshot with a stall watchdog, verify, move into place."""

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
author: modelfleet
options:
  root: {description: Models root., type: path, required: true}
  lock: {description: The lock from hf_lock., type: dict, required: true}
  endpoint: {description: Hub endpoint., type: str}
  token_file: {description: Root-only file with the hub token., type: path}
  max_workers: {description: Parallel file downloads., type: int, default: 8}
  stall_seconds: {description: Seconds without new bytes before the transfer is restarted., type: float, default: 120}
  max_stalls: {description: Restarts allowed before failing., type: int, default: 3}
  verify_existing: {description: 'Re-check a complete model: none, size (cheap), or full (sha256 of every file); a bad file is fetched again.', type: str, choices: [none, size, full], default: size}
  owner: {description: Owner of the final files., type: str, default: root}
  group: {description: Group of the final files., type: str, default: root}
attributes:
  check_mode: {support: full}
  diff_mode: {support: none}
"""

EXAMPLES = r"""
- name: Fetch (detached)
  hf_snapshot:
    root: /models
    lock: "{{ __lock.lock }}"
  async: 86400
  poll: 0
"""

RETURN = r"""
final: {description: The model directory., returned: success, type: str}
bytes: {description: Bytes in the model., returned: success, type: int}
verify: {description: 'Verification figures: bytes_hashed, seconds, mb_per_s, refetched.', returned: success, type: dict}
download: {description: 'attempts, stalls, seconds, bytes_per_s.', returned: success, type: dict}
"""

import grp
import os
import pwd
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.modelfleet.errors import ModelfleetError
from ansible.module_utils.modelfleet.fetch import (
    FetchError,
    ModelWriteLock,
    download_with_watchdog,
    finalize,
    is_complete,
    model_paths,
    prepare_staging,
    refetch_file,
    reopen_complete,
    verify_tree,
    write_status,
)
from ansible.module_utils.modelfleet.secrets import read_secret_file


def main():
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "lock": {"type": "dict", "required": True},
            "endpoint": {"type": "str"},
            "token_file": {"type": "path"},
            "max_workers": {"type": "int", "default": 8},
            "stall_seconds": {"type": "float", "default": 120},
            "max_stalls": {"type": "int", "default": 3},
            "verify_existing": {"type": "str", "choices": ["none", "size", "full"], "default": "size"},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
        },
        supports_check_mode=True,
    )
    p = module.params
    lock = p["lock"]
    token = None
    if p["token_file"]:
        try:
            token = read_secret_file(p["token_file"], "token file") or None
        except ModelfleetError as e:
            module.fail_json(msg=f"hf_snapshot: {e}")
    try:
        paths = model_paths(p["root"], lock["repo_id"], lock["revision"])
        if not module.check_mode:
            # held until this module (and its download child) ends: one writer per model
            ModelWriteLock(paths).acquire()
        reopened = None
        if is_complete(paths["final"], lock["revision"]):
            if p["verify_existing"] == "none":
                module.exit_json(changed=False, final=paths["final"], bytes=lock["total_bytes"], already_complete=True)
            if module.check_mode:
                module.exit_json(changed=False, final=paths["final"], bytes=lock["total_bytes"], already_complete=True)
            reopened = reopen_complete(paths["final"], paths["staging"], lock, p["verify_existing"] == "full")
            if reopened["ok"]:
                module.exit_json(changed=False, final=paths["final"], bytes=lock["total_bytes"], already_complete=True,
                                 verify={k: reopened[k] for k in ("bytes_hashed", "mb_per_s")})
        if module.check_mode:
            module.exit_json(changed=True, final=paths["final"], bytes=lock["total_bytes"],
                             msg=f"would fetch {len(lock['files'])} files, {lock['total_bytes']} bytes")
        try:
            owner = (pwd.getpwnam(p["owner"]).pw_uid, grp.getgrnam(p["group"]).gr_gid)
        except KeyError as e:
            module.fail_json(msg=f"owner/group {e} does not exist on the host")
        os.makedirs(paths["staging"], exist_ok=True)
        if not os.access(paths["staging"], os.W_OK):
            raise FetchError(f"{paths['staging']} is not writable")
        events = []
        if reopened:
            events.append(f"complete model failed re-verification: {[b['name'] for b in reopened['bad']]}")
        pre = prepare_staging(paths["staging"], lock)
        todo_lock = dict(lock, files=pre["todo"])
        dl = {"attempts": 0, "stalls": 0, "seconds": 0.0}
        if pre["todo"]:
            dl = download_with_watchdog(repo_id=lock["repo_id"], lock=todo_lock, staging=paths["staging"],
                                        status_path=paths["status"], endpoint=p["endpoint"], token=token,
                                        max_workers=p["max_workers"], stall_seconds=p["stall_seconds"],
                                        max_stalls=p["max_stalls"], log=events.append)
        write_status(paths["status"], {"state": "verifying", "repo_id": lock["repo_id"], "revision": lock["revision"],
                                       "bytes_done": lock["total_bytes"], "bytes_total": lock["total_bytes"],
                                       "updated_at": time.time()})
        v = verify_tree(paths["staging"], todo_lock)
        refetched = []
        if not v["ok"]:
            for bad in v["bad"]:
                refetch_file(lock["repo_id"], lock["revision"], paths["staging"], bad["name"], p["endpoint"], token)
                refetched.append(bad["name"])
            v2 = verify_tree(paths["staging"], {"files": [e for e in lock["files"] if e["name"] in refetched]})
            if not v2["ok"]:
                b = v2["bad"][0]
                raise FetchError(f"{b['name']}: still wrong after one re-fetch ({b['reason']}); the source serves a "
                                 "file that does not match its own metadata - nothing was marked complete")
        finalize(paths["staging"], paths["final"], lock, owner)
        write_status(paths["status"], {"state": "complete", "repo_id": lock["repo_id"], "revision": lock["revision"],
                                       "bytes_done": lock["total_bytes"], "bytes_total": lock["total_bytes"],
                                       "percent": 100.0, "updated_at": time.time(), "final": paths["final"]})
    except ModelfleetError as e:
        try:
            write_status(paths["status"], {"state": "failed", "reason": str(e), "updated_at": time.time()})
        except (OSError, NameError):
            pass
        module.fail_json(msg=str(e))
    except OSError as e:
        module.fail_json(msg=f"fetch failed writing under {p['root']}: {e} (no space? unwritable target?); "
                             "nothing was marked complete")
    fetched_bytes = sum(e["size"] for e in pre["todo"])
    module.exit_json(changed=True, final=paths["final"], bytes=lock["total_bytes"], events=events,
                     kept=pre["kept"], fetched=[e["name"] for e in pre["todo"]], fetched_bytes=fetched_bytes,
                     download={**dl, "bytes_per_s": fetched_bytes / max(dl["seconds"], 1e-9)},
                     verify={"bytes_hashed": v["bytes_hashed"], "seconds": round(v["seconds"], 3),
                             "mb_per_s": round(v["mb_per_s"], 1), "refetched": refetched})


if __name__ == "__main__":
    main()
