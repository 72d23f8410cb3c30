"""The hf_snapshot workflow as a function (issue 21: modules are shells), on real folders and without a hub: what
an interrupted attempt left in staging is kept when it matches and finishes the model with no download; a
complete model is not fetched again; check mode writes nothing. Downloads through the real huggingface_hub
against the local hub server are tests/integration/test_fetch.py's (the module)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import (
    FetchError,
    is_complete,
    model_paths,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.snapshot import fetch_snapshot

REV = "d" * 40
FILES = {"config.json": b'{"a": 1}', "w.safetensors": os.urandom(8192)}


def _lock():
    return {"repo_id": "org/m", "revision": REV, "total_bytes": sum(len(b) for b in FILES.values()),
            "files": [{"name": n, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in FILES.items()]}


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_check_mode_on_a_fresh_root_says_what_it_would_fetch_and_writes_nothing(tmp_path):
    res = fetch_snapshot(root=str(tmp_path), lock=_lock(), check_mode=True, endpoint="http://127.0.0.1:9")
    assert res["changed"] and res["msg"] == f"would fetch 2 files, {_lock()['total_bytes']} bytes"
    assert _tree(tmp_path) == []


def test_what_staging_holds_and_matches_finishes_the_model_without_a_download(tmp_path):
    paths = model_paths(str(tmp_path), "org/m", REV)
    os.makedirs(paths["staging"])
    for n, b in FILES.items():
        with open(os.path.join(paths["staging"], n), "wb") as f:
            f.write(b)
    # an endpoint nothing listens on: any download attempt would fail the call
    res = fetch_snapshot(root=str(tmp_path), lock=_lock(), endpoint="http://127.0.0.1:9", hold_lock=False)
    assert res["changed"] and res["fetched"] == [] and sorted(res["kept"]) == sorted(FILES)
    assert res["download"]["attempts"] == 0 and is_complete(paths["final"], REV)
    assert json.load(open(paths["status"]))["state"] == "complete"
    # the next call finds it complete: nothing fetched again
    again = fetch_snapshot(root=str(tmp_path), lock=_lock(), endpoint="http://127.0.0.1:9", hold_lock=False)
    assert again == {"changed": False, "final": paths["final"], "bytes": _lock()["total_bytes"],
                     "already_complete": True, "verify": again["verify"]}
    assert fetch_snapshot(root=str(tmp_path), lock=_lock(), verify_existing="none", hold_lock=False)[
        "already_complete"]


@pytest.mark.parametrize("lock, says", [
    ({"revision": REV, "files": [], "total_bytes": 0}, "the lock has no repo_id: pass the lock hf_lock returned"),
    ({"repo_id": "org/m", "revision": "main", "files": [], "total_bytes": 0}, "is not a 40-hex commit"),
])
def test_a_lock_that_is_not_one_is_named_and_nothing_is_written(tmp_path, lock, says):
    with pytest.raises(FetchError) as e:
        fetch_snapshot(root=str(tmp_path), lock=lock, hold_lock=False)
    assert says in str(e.value) and _tree(tmp_path) == []


def test_an_unknown_verify_level_is_refused(tmp_path):
    with pytest.raises(FetchError) as e:
        fetch_snapshot(root=str(tmp_path), lock=_lock(), verify_existing="some", hold_lock=False)
    assert "verify_existing 'some' is not one of none, size, full" in str(e.value)


def test_the_final_files_owner_is_looked_up_once_for_both_modules():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import owner_ids

    assert owner_ids("root", "root") == (0, 0)
    with pytest.raises(FetchError) as e:
        owner_ids("no-such-user-mf", "root")
    assert "no-such-user-mf" in str(e.value) and str(e.value).endswith("does not exist on the host")
