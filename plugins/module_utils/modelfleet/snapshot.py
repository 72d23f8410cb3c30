"""Download a locked model into the host's models root (the hf_snapshot module's workflow, issue 21: modules are
shells): one writer per model (its write lock), a complete model re-verified (and reopened when bad) instead of
downloaded again, files already in staging kept when they match, the rest downloaded under the stall
watchdog, every file verified (a bad one re-fetched once), and only then moved into place and marked complete.
The status file says where it is (downloading, verifying, complete, failed)."""

from __future__ import annotations

import os
import time

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import (
    FetchError,
    ModelWriteLock,
    apply_hub_environment,
    download_with_watchdog,
    finalize,
    hub_environment,
    is_complete,
    model_paths,
    prepare_staging,
    refetch_file,
    reopen_complete,
    verify_tree,
    write_status,
)

VERIFY_EXISTING = ("none", "size", "full")


def fetch_snapshot(*, root: str, lock: dict, endpoint: str | None = None, token: str | None = None,
                   owner: tuple[int, int] | None = None, max_workers: int = 8, stall_seconds: float = 120,
                   max_stalls: int = 3, verify_existing: str = "size", check_mode: bool = False,
                   hold_lock: bool = True, xet: bool = False, xet_cache_bytes: int = 0,
                   xet_high_performance: bool = False) -> dict:
    """Returns the module's result: {changed, final, bytes, already_complete?, events, kept, fetched,
    fetched_bytes, download, verify, msg?}. Raises ModelfleetError (the status file then says failed) or
    OSError (writing under the root failed); nothing incomplete is ever marked complete."""
    if verify_existing not in VERIFY_EXISTING:
        raise FetchError(f"verify_existing {verify_existing!r} is not one of {', '.join(VERIFY_EXISTING)}")
    missing = [k for k in ("repo_id", "revision", "files", "total_bytes") if k not in lock]
    if missing:
        raise FetchError(f"the lock has no {', '.join(missing)}: pass the lock hf_lock returned")
    paths = model_paths(root, lock["repo_id"], lock["revision"])
    # before anything imports huggingface_hub (the download child inherits it): Xet off unless asked, its cache
    # inside the staging folder when on (fetch.hub_environment)
    apply_hub_environment(hub_environment(paths["staging"], xet, xet_cache_bytes, xet_high_performance))
    try:
        return _fetch(paths, lock, endpoint, token, owner, max_workers, stall_seconds, max_stalls, verify_existing,
                      check_mode, hold_lock)
    except ModelfleetError as e:
        if not check_mode:
            try:
                write_status(paths["status"], {"state": "failed", "reason": str(e), "updated_at": time.time()})
            except OSError:
                pass
        raise


def _fetch(paths, lock, endpoint, token, owner, max_workers, stall_seconds, max_stalls, verify_existing, check_mode,
           hold_lock) -> dict:
    done = {"changed": False, "final": paths["final"], "bytes": lock["total_bytes"], "already_complete": True}
    if hold_lock and not check_mode:
        # held until this process (and its download child) ends: one writer per model
        ModelWriteLock(paths).acquire()
    reopened = None
    if is_complete(paths["final"], lock["revision"]):
        if verify_existing == "none" or check_mode:
            return done
        reopened = reopen_complete(paths["final"], paths["staging"], lock, verify_existing == "full")
        if reopened["ok"]:
            return {**done, "verify": {k: reopened[k] for k in ("bytes_hashed", "mb_per_s")}}
    if check_mode:
        return {"changed": True, "final": paths["final"], "bytes": lock["total_bytes"],
                "msg": f"would fetch {len(lock['files'])} files, {lock['total_bytes']} bytes"}
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
                                    status_path=paths["status"], endpoint=endpoint, token=token,
                                    max_workers=max_workers, stall_seconds=stall_seconds, max_stalls=max_stalls,
                                    log=events.append)
    write_status(paths["status"], {"state": "verifying", "repo_id": lock["repo_id"], "revision": lock["revision"],
                                   "bytes_done": lock["total_bytes"], "bytes_total": lock["total_bytes"],
                                   "updated_at": time.time()})
    v = verify_tree(paths["staging"], todo_lock)
    refetched = []
    if not v["ok"]:
        for bad in v["bad"]:
            refetch_file(lock["repo_id"], lock["revision"], paths["staging"], bad["name"], endpoint, token)
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
    fetched_bytes = sum(e["size"] for e in pre["todo"])
    return {"changed": True, "final": paths["final"], "bytes": lock["total_bytes"], "events": events,
            "kept": pre["kept"], "fetched": [e["name"] for e in pre["todo"]], "fetched_bytes": fetched_bytes,
            "download": {**dl, "bytes_per_s": fetched_bytes / max(dl["seconds"], 1e-9)},
            "verify": {"bytes_hashed": v["bytes_hashed"], "seconds": round(v["seconds"], 3),
                       "mb_per_s": round(v["mb_per_s"], 1), "refetched": refetched}}
