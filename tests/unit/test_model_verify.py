"""The hf_verify workflow as a function (issue 21: modules are shells), on real folders: a received tree is moved
into place only when every file matches the lock; a complete model is re-verified, and a bad one fails or is
reopened for re-fetch; check mode changes nothing."""

from __future__ import annotations

import hashlib
import os

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import is_complete, model_paths
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.model_verify import VerifyError, verify_model

REV = "c" * 40
FILES = {"config.json": b'{"a": 1}', "w.safetensors": os.urandom(4096)}


def _lock():
    return {"repo_id": "org/m", "revision": REV,
            "files": [{"name": n, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in FILES.items()]}


def _received(root, damage=None):
    staging = model_paths(str(root), "org/m", REV)["staging"]
    os.makedirs(staging)
    for n, b in FILES.items():
        with open(os.path.join(staging, n), "wb") as f:
            f.write(b"X" + b[1:] if n == damage else b)
    return staging


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_received_tree_is_finalized_only_after_every_file_matches(tmp_path):
    _received(tmp_path)
    res = verify_model(root=str(tmp_path), lock=_lock(), check_mode=True, hold_lock=False)
    final = model_paths(str(tmp_path), "org/m", REV)["final"]
    assert not res["changed"] and not is_complete(final, REV)
    res = verify_model(root=str(tmp_path), lock=_lock(), hold_lock=False)
    assert res["changed"] and res["final"] == final and is_complete(final, REV)
    assert res["verify"]["ok"] and res["verify"]["bytes_hashed"] == sum(len(b) for b in FILES.values())
    # a second call re-verifies the complete model and changes nothing
    again = verify_model(root=str(tmp_path), lock=_lock(), hold_lock=False)
    assert not again["changed"] and not again["reopened"]


def test_a_bad_received_file_is_named_and_nothing_is_marked_complete(tmp_path):
    staging = _received(tmp_path, damage="w.safetensors")
    before = _tree(tmp_path)
    with pytest.raises(VerifyError) as e:
        verify_model(root=str(tmp_path), lock=_lock(), hold_lock=False)
    assert str(e.value).startswith(f"{staging}/w.safetensors: sha256 ")
    assert str(e.value).endswith("(1 bad file(s)); nothing was marked complete")
    assert e.value.details["verify"]["bad"][0]["name"] == "w.safetensors" and _tree(tmp_path) == before


def test_a_damaged_complete_model_fails_or_is_reopened_for_re_fetch(tmp_path):
    _received(tmp_path)
    final = verify_model(root=str(tmp_path), lock=_lock(), hold_lock=False)["final"]
    with open(os.path.join(final, "w.safetensors"), "r+b") as f:
        f.write(b"Y")
    # the cheap level sees only sizes; the full level hashes
    assert verify_model(root=str(tmp_path), lock=_lock(), level="size", hold_lock=False)["verify"]["ok"]
    with pytest.raises(VerifyError) as e:
        verify_model(root=str(tmp_path), lock=_lock(), hold_lock=False)
    assert str(e.value).startswith(f"{final}/w.safetensors: sha256 ")
    # check mode does not reopen: it reports the failure and leaves the model as it is
    with pytest.raises(VerifyError):
        verify_model(root=str(tmp_path), lock=_lock(), reopen_bad=True, check_mode=True, hold_lock=False)
    assert is_complete(final, REV)


def test_reopen_bad_takes_a_damaged_model_back_to_staging(tmp_path):
    _received(tmp_path)
    final = verify_model(root=str(tmp_path), lock=_lock(), hold_lock=False)["final"]
    with open(os.path.join(final, "w.safetensors"), "r+b") as f:
        f.write(b"Y")
    res = verify_model(root=str(tmp_path), lock=_lock(), reopen_bad=True, hold_lock=False)
    assert res["changed"] and res["reopened"] and res["msg"].startswith("w.safetensors: sha256 ")
    assert not is_complete(final, REV)


def test_a_lock_without_its_repo_is_named(tmp_path):
    with pytest.raises(VerifyError) as e:
        verify_model(root=str(tmp_path), lock={"revision": REV, "files": []}, hold_lock=False)
    assert "the lock has no 'repo_id'" in str(e.value)
