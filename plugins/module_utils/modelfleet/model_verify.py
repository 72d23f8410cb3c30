"""Verify a model tree against its lock and finalize it (the hf_verify module's workflow, issue 21: modules are
shells). Used on fan-out targets, which receive the files from another host and never contact the hub, and to
re-verify a complete model: only a fully verified tree is moved into place and marked complete."""

from __future__ import annotations

import os

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import (
    ModelWriteLock,
    finalize,
    is_complete,
    model_paths,
    reopen_complete,
    verify_tree,
)


class VerifyError(ModelfleetError):
    """A tree that does not match its lock, or a verify that could not run; `verify` holds the per-file result
    when there is one. Nothing is marked complete."""

    def __init__(self, msg: str, verify: dict | None = None):
        super().__init__(msg)
        self.details = {"verify": verify} if verify is not None else {}


def sizes_only(final: str, lock: dict) -> dict:
    """The cheap check of a complete model: every locked file there at its locked size."""
    bad = [{"name": e["name"], "ok": False, "reason": "missing or wrong size"} for e in lock["files"]
           if not os.path.isfile(os.path.join(final, e["name"]))
           or os.path.getsize(os.path.join(final, e["name"])) != e["size"]]
    return {"ok": not bad, "bad": bad, "bytes_hashed": 0, "seconds": 0, "mb_per_s": 0}


def verify_model(*, root: str, lock: dict, source: str | None = None, finalize_tree: bool = True,
                 level: str = "full", reopen_bad: bool = False, owner: tuple[int, int] | None = None,
                 check_mode: bool = False, hold_lock: bool = True) -> dict:
    """A complete model (no source): re-verify it (level full: sha256 of every file; size: sizes only); a bad one
    fails, or with reopen_bad goes back to staging (marker removed) so only its bad files are fetched again.
    Otherwise verify the received tree (source, default the staging folder) and, unless check mode or
    finalize_tree is false, move it into place with `owner` (uid, gid) and mark it complete. The model's
    write lock is taken first when anything may change (hold_lock: it is held until the process ends, as a
    module's is). Returns {changed, reopened, final, verify[, msg]}; raises VerifyError."""
    try:
        paths = model_paths(root, lock["repo_id"], lock["revision"])
    except KeyError as e:
        raise VerifyError(f"the lock has no {e}: pass the lock hf_lock returned") from None
    if hold_lock and not check_mode and (reopen_bad or finalize_tree):
        ModelWriteLock(paths).acquire()
    if is_complete(paths["final"], lock["revision"]) and not source:
        if check_mode or not reopen_bad:
            v = verify_tree(paths["final"], lock) if level == "full" else sizes_only(paths["final"], lock)
        else:
            v = reopen_complete(paths["final"], paths["staging"], lock, level == "full")
        if not v["ok"]:
            b = v["bad"][0]
            if reopen_bad and not check_mode:
                return {"changed": True, "reopened": True, "final": paths["final"], "verify": v,
                        "msg": f"{b['name']}: {b['reason']}; reopened for re-fetch"}
            raise VerifyError(f"{paths['final']}/{b['name']}: {b['reason']}", v)
        return {"changed": False, "reopened": False, "final": paths["final"], "verify": v}
    src = source or paths["staging"]
    v = verify_tree(src, lock)
    if not v["ok"]:
        b = v["bad"][0]
        raise VerifyError(f"{src}/{b['name']}: {b['reason']} ({len(v['bad'])} bad file(s)); nothing was marked "
                          "complete", v)
    if check_mode or not finalize_tree:
        return {"changed": False, "reopened": False, "final": paths["final"], "verify": v}
    finalize(src, paths["final"], lock, owner)
    return {"changed": True, "reopened": False, "final": paths["final"], "verify": v}
