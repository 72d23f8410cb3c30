"""The storage_reclaim workflow as a function (issue 21: modules are shells): refusals that delete nothing, check
mode, the deletion and its log, called directly on real folders. The space arithmetic on a filesystem of known
size is tests/integration/test_storage_reclaim.py's (a private tmpfs, through the module)."""

from __future__ import annotations

import json
import os

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.reclaim import ReclaimError, reclaim


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "models"
    for name, age in (("org--fallback/" + "a" * 40, 100), ("org--other/" + "b" * 40, 200)):
        d = r / name
        (d / ".modelfleet").mkdir(parents=True)
        (d / "w.safetensors").write_bytes(os.urandom(2**16))
        (d / ".modelfleet" / "complete").touch()
        (d / ".modelfleet" / "last_used").touch()
        os.utime(d / ".modelfleet" / "last_used", (age, age))
    return r


def _args(root, tmp_path, **kw):
    fb = str(root / "org--fallback" / ("a" * 40))
    return {"root": str(root), "log_path": str(tmp_path / "log.jsonl"), "lock_path": str(tmp_path / "lock"),
            "explicit": [fb], "fallback": [fb], "read_units": False, **kw}


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_remove_explicit_in_check_mode_deletes_nothing_then_deletes_and_logs(root, tmp_path):
    before = _tree(root)
    res = reclaim(**_args(root, tmp_path, mode="remove_explicit"), check_mode=True)
    fb = str(root / "org--fallback" / ("a" * 40))
    assert res["changed"] and res["would_delete"] == [fb] and res["deleted"] == [] and _tree(root) == before
    assert res["diff"]["before"] != res["diff"]["after"] and fb not in res["diff"]["after"]
    res = reclaim(**_args(root, tmp_path, mode="remove_explicit", run_id="r1"))
    assert res["changed"] and not os.path.exists(fb) and (root / "org--other" / ("b" * 40)).is_dir()
    (rec,) = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert rec["path"] == fb and rec["mode"] == "remove_explicit" and rec["run_id"] == "r1" and rec["bytes"] > 0
    assert [d["path"] for d in res["deleted"]] == [fb]


def test_room_that_exists_deletes_nothing_and_keeps_the_fallback_for_after_the_verify(root, tmp_path):
    before = _tree(root)
    res = reclaim(**_args(root, tmp_path, required_bytes=1))
    assert not res["changed"] and res["deleted"] == [] and _tree(root) == before
    assert [d["path"] for d in res["plan"]["delete_after_verify"]] == [str(root / "org--fallback" / ("a" * 40))]


@pytest.mark.parametrize("kw, says", [
    ({"required_bytes": 10**18}, "Nothing was deleted."),
    ({"required_bytes": "a lot"}, "storage_reclaim: required_bytes: "),
    ({"mode": "nuke"}, "storage_reclaim: mode 'nuke' is not one of make_room, remove_explicit"),
])
def test_refusals_name_the_problem_and_delete_nothing(root, tmp_path, kw, says):
    before = _tree(root)
    with pytest.raises(ReclaimError) as e:
        reclaim(**_args(root, tmp_path, **kw))
    assert says in str(e.value) and _tree(root) == before
    assert e.value.details.get("deleted", []) == []
    assert not (tmp_path / "log.jsonl").exists()


def test_a_root_that_is_not_a_models_folder_is_refused(tmp_path):
    with pytest.raises(ReclaimError) as e:
        reclaim(root="/", required_bytes=1, read_units=False, lock_path=str(tmp_path / "lock"))
    assert "'/' is /" in str(e.value)
    with pytest.raises(ReclaimError) as e:
        reclaim(root=str(tmp_path / "absent"), required_bytes=1, read_units=False, lock_path=str(tmp_path / "lock"))
    assert "does not exist or is not a folder; create it" in str(e.value)


def test_another_runs_lock_is_a_refusal(root, tmp_path):
    import fcntl

    lock = tmp_path / "lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ReclaimError) as e:
            reclaim(**_args(root, tmp_path, mode="remove_explicit"))
    assert (root / "org--fallback" / ("a" * 40)).is_dir() and e.value.details["deleted"] == []
