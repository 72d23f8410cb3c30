"""Free exactly the space a new model needs (the storage_reclaim module's workflow, issue 21: modules are
shells): under the host-wide lock, measure and plan (disk.plan_host, so the plan cannot be stale), refuse
what the plan refuses before anything is deleted, then delete the planned model folders one by one (each with
disk.delete_model_dir's guards) and log each deletion as one JSON line."""

from __future__ import annotations

import json
import os
import time

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.disk import (
    HostLock,
    check_models_root,
    delete_model_dir,
    measure_fs,
    plan_host,
    purge_trash,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import fmt_bytes, parse_size

MODES = ("make_room", "remove_explicit")


class ReclaimError(ModelfleetError):
    """The reclaim refused or failed; `details` (plan, deleted) say what was planned and what was deleted."""

    def __init__(self, msg: str, **details):
        super().__init__(msg)
        self.details = details


def log_deletion(path: str, record: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def reclaim(*, root: str, required_bytes=0, headroom_bytes: int = 0, headroom_percent: float = 0.0,
            explicit=(), protected=(), in_use=(), deploying=(), fallback=(), allow_delete_fallback: bool = False,
            present_bytes: int = 0, mode: str = "make_room", log_path: str = "/var/log/modelfleet/storage.log",
            lock_path: str = "/run/lock/modelfleet-storage.lock", lock_wait_seconds: float = 0, run_id: str = "",
            read_units: bool = True, check_mode: bool = False) -> dict:
    """make_room: delete only what the shortfall needs (a fallback only when allowed); remove_explicit: delete the
    explicit folders (after the new model serves), every guard re-checked. Check mode plans and deletes nothing.
    Returns {changed, plan, deleted, free_bytes_after, would_delete, diff}; raises ReclaimError (nothing deleted
    when it is a refusal; `details["deleted"]` lists what was, when a deletion fails midway)."""
    if mode not in MODES:
        raise ReclaimError(f"storage_reclaim: mode {mode!r} is not one of {', '.join(MODES)}")
    try:
        required = parse_size(required_bytes)
    except ValueError as e:
        raise ReclaimError(f"storage_reclaim: required_bytes: {e}") from None
    try:
        root = check_models_root(root, "storage_reclaim: root")
    except ModelfleetError as e:
        raise ReclaimError(str(e)) from None
    if not os.path.isdir(root):
        raise ReclaimError(f"storage_reclaim: models root {root} does not exist or is not a folder; create it "
                           f"(mkdir -p {root}) or set the right root")
    remove_all = mode == "remove_explicit"
    deleted: list[dict] = []
    try:
        with HostLock(lock_path, owner=run_id, wait_seconds=lock_wait_seconds):
            if not check_mode:
                purge_trash(root)
            plan = plan_host(root=root, required_bytes=0 if remove_all else required,
                             headroom_bytes=0 if remove_all else headroom_bytes,
                             headroom_percent=0.0 if remove_all else headroom_percent,
                             explicit=list(explicit), protected=list(protected), in_use=list(in_use),
                             deploying=list(deploying), present_bytes=present_bytes,
                             fallback=() if remove_all else list(fallback), read_units=read_units)
            before = sorted(plan["candidates"])
            todo = plan["delete_after_verify"] if remove_all else plan["delete"]
            if not remove_all and not plan["feasible"]:
                raise ReclaimError(f"storage_reclaim: {plan['message']}. Nothing was deleted.", plan=plan, deleted=[])
            early = plan["fallback_deleted_early"]
            if early and not remove_all and not allow_delete_fallback:
                raise ReclaimError(
                    f"storage_reclaim: space does not allow keeping the fallback until the new model is verified: "
                    f"no deletion of other models covers the shortfall of {fmt_bytes(plan['shortfall_bytes'])}, "
                    f"only deleting {', '.join(early)} first does. Set allow_delete_fallback "
                    "(storage_cleanup_allow_delete_fallback: true) to accept that, or free space elsewhere. Nothing "
                    "was deleted.", plan=plan, deleted=[])
            if not check_mode:
                for d in todo:
                    expect = (d["dev"], d["ino"]) if d.get("dev") is not None else None
                    freed = delete_model_dir(root, d["path"], expect=expect)
                    rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "path": d["path"],
                           "bytes": freed, "mode": mode, "run_id": run_id, "host_pid": os.getpid()}
                    log_deletion(log_path, rec)
                    deleted.append(rec)
            after_fs = plan["filesystem"] if check_mode else measure_fs(root)
    except ReclaimError:
        raise
    except ModelfleetError as e:
        raise ReclaimError(str(e), deleted=deleted) from None
    gone = {d["path"] for d in todo}
    return {"changed": bool(todo), "plan": plan, "deleted": deleted, "free_bytes_after": after_fs["free_bytes"],
            "would_delete": [d["path"] for d in todo] if check_mode else [],
            "diff": {"before": "\n".join(before) + "\n", "after": "\n".join(x for x in before if x not in gone) + "\n"}}
