"""Guards that mutation testing (scripts/mutation.sh) found unchecked: what counts as a model, the root's
spelling, the input checks, and delete_model_dir's own refusals and clean-up, each on a real folder tree."""

from __future__ import annotations

import os

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.disk import (
    check_models_root,
    delete_model_dir,
    model_evidence,
    plan_disk,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import DiskPlanError

REV = "a" * 40


def _checkpoint(p, weights=("model.safetensors",)):
    p.mkdir(parents=True, exist_ok=True)
    (p / "config.json").write_text("{}")
    for w in weights:
        (p / w).write_bytes(b"w" * 64)
    return p


def _layout(tmp_path, kind):
    p = tmp_path / "org--m" / REV
    if kind == "config-and-readme":
        _checkpoint(p, weights=())
        (p / "README.md").write_text("not weights")
    elif kind == "config-and-dangling-weight":
        _checkpoint(p, weights=())
        (p / "model.safetensors").symlink_to(tmp_path / "gone")
    elif kind == "config-and-weight-folder":
        _checkpoint(p, weights=())
        (p / "model.safetensors").mkdir()
    elif kind in ("marker-lock", "marker-complete"):
        (p / ".modelfleet").mkdir(parents=True)
        (p / ".modelfleet" / ("lock.json" if kind == "marker-lock" else "complete")).write_text("{}")
    elif kind in ("top-level-lock", "top-level-complete"):
        p.mkdir(parents=True)
        (p / ("lock.json" if kind == "top-level-lock" else "complete")).write_text("{}")
    elif kind == "checkpoint":
        _checkpoint(p)
    elif kind in ("hub-cache", "hub-cache-trailing-slash"):
        p = tmp_path / "models--org--m"
        _checkpoint(p / "snapshots" / REV)
    elif kind == "snapshots-not-hub-named":
        p = tmp_path / "data--org--m"
        _checkpoint(p / "snapshots" / REV)
    elif kind == "hub-snapshots-is-a-file":
        p = tmp_path / "models--org--m"
        p.mkdir()
        (p / "snapshots").write_text("x")
    elif kind == "hub-snapshot-without-weights":
        p = tmp_path / "models--org--m"
        _checkpoint(p / "snapshots" / REV, weights=())
    return p


@pytest.mark.parametrize(("kind", "evidence"), [
    ("config-and-readme", None),
    ("config-and-dangling-weight", None),
    ("config-and-weight-folder", None),
    ("marker-lock", "modelfleet marker"),
    ("marker-complete", "modelfleet marker"),
    ("top-level-lock", None),
    ("top-level-complete", None),
    ("checkpoint", "checkpoint (config.json + 1 weight file(s))"),
    ("hub-cache", f"hub cache layout (snapshots/{REV})"),
    ("hub-cache-trailing-slash", f"hub cache layout (snapshots/{REV})"),
    ("snapshots-not-hub-named", None),
    ("hub-snapshots-is-a-file", None),
    ("hub-snapshot-without-weights", None),
])
def test_what_counts_as_a_model(tmp_path, kind, evidence):
    p = _layout(tmp_path, kind)
    path = str(p) + ("/" if kind.endswith("trailing-slash") else "")
    assert model_evidence(path) == evidence


def test_root_spelling_is_normalised_and_resolved_only_when_asked(tmp_path):
    assert check_models_root("//srv/models", resolve=False) == "/srv/models"
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert check_models_root(str(tmp_path / "link"), resolve=False) == str(tmp_path / "link")
    assert check_models_root(str(tmp_path / "link")) == str(real)


@pytest.mark.parametrize(("kw", "needle"), [
    ({"headroom_bytes": True}, "headroom bytes"),
    ({"headroom_percent": 100}, "headroom percent"),
    ({"headroom_percent": 100.0}, "headroom percent"),
])
def test_input_edges(kw, needle):
    args = dict(root="/models", free_bytes=0, total_bytes=1, required_bytes=1, candidates=[], realpath=lambda p: p)
    args.update(kw)
    with pytest.raises(DiskPlanError, match=needle):
        plan_disk(**args)


def test_delete_refuses_a_model_beside_the_root_and_the_root_itself(tmp_path):
    root = tmp_path / "models"
    _checkpoint(root)  # even a root that looks like a checkpoint is never deleted as one
    beside = _checkpoint(tmp_path / "other" / REV)
    for target in (beside, root, root / ".." / "other" / REV):
        with pytest.raises(DiskPlanError, match="not strictly inside the models root"):
            delete_model_dir(str(root), str(target))
    assert (beside / "model.safetensors").exists() and (root / "model.safetensors").exists()


def test_delete_removes_an_emptied_org_folder_and_keeps_one_still_in_use(tmp_path):
    root = tmp_path / "models"
    one = _checkpoint(root / "org--one" / REV)
    two_a, two_b = _checkpoint(root / "org--two" / REV), _checkpoint(root / "org--two" / ("b" * 40))
    assert delete_model_dir(str(root), str(one)) > 0
    assert not (root / "org--one").exists()
    delete_model_dir(str(root), str(two_a))
    assert not two_a.exists() and two_b.exists() and (root / "org--two").is_dir()
    assert not [e for e in os.listdir(root) if e.startswith(".trash-")]


def test_a_crash_after_the_marker_goes_leaves_nothing_that_looks_complete(tmp_path, monkeypatch):
    root = tmp_path / "models"
    m = _checkpoint(root / "org--m" / REV)
    (m / ".modelfleet").mkdir()
    (m / ".modelfleet" / "complete").write_text("")

    def crash(*a, **kw):
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(OSError, match="simulated crash"):
        delete_model_dir(str(root), str(m))
    assert m.is_dir() and (m / "model.safetensors").exists()
    assert not (m / ".modelfleet" / "complete").exists()  # the marker went first


def _cand(path, gb, last_used):
    b = int(gb * 1e9)
    return {"path": path, "allocated_bytes": b, "exclusive_allocated_bytes": b, "last_used": last_used,
            "model": True}


def test_a_kept_fallback_first_in_lru_order_does_not_stop_the_search():
    """The oldest model is the fallback (kept until the new one is verified): the plan passes over it and
    deletes the next-oldest instead, instead of giving up at the first kept entry."""
    old, mid, new = _cand("/models/old", 300, 1.0), _cand("/models/mid", 300, 2.0), _cand("/models/new", 300, 3.0)
    plan = plan_disk(root="/models", free_bytes=100 * 10**9, total_bytes=2000 * 10**9, required_bytes=350 * 10**9,
                     candidates=[old, mid, new], keep_until_verified=("/models/old",), realpath=lambda p: p)
    assert plan["feasible"] and [d["path"] for d in plan["delete"]] == ["/models/mid"]


def test_an_unknown_explicit_entry_is_refused_and_the_rest_still_counts():
    # the named model is newer than another one that would also do: named entries go first
    m, older = _cand("/models/m", 500, 5.0), _cand("/models/older", 500, 1.0)
    plan = plan_disk(root="/models", free_bytes=100 * 10**9, total_bytes=2000 * 10**9, required_bytes=350 * 10**9,
                     candidates=[m, older], explicit=("/models/not-there", "/models/m"), defer_explicit=False,
                     realpath=lambda p: p)
    assert {"path": "/models/not-there", "reason": "not a model directory under the root"} in plan["refused"]
    assert [d["path"] for d in plan["delete"]] == ["/models/m"] and plan["feasible"]
