"""storage_cleanup on a 96 MiB tmpfs with five models and a folder that is not a model: it frees exactly
enough (the least recently used model that is not in use), keeps the one a unit serves, the one a nohup
server holds open, the one a container-style unit names only in a -v volume, and the older non-model
folder; reports figures that match df to the byte; check mode deleted nothing; the log records what went."""

import json

INUSE = "/models/acme--inuse/1111111111111111111111111111111111111111"
OLD = "/models/acme--old/2222222222222222222222222222222222222222"
NEWER = "/models/acme--newer/3333333333333333333333333333333333333333"
NOHUP = "/models/acme--nohup/4444444444444444444444444444444444444444"
CTR = "/models/acme--ctr/5555555555555555555555555555555555555555"
DATASETS = "/models/datasets"
REQUIRED = 47185920


def _outcome(host):
    return json.loads(host.file("/root/storage_outcome.json").content_string)


def test_models_is_a_real_small_filesystem(host):
    mnt = host.mount_point("/models")
    assert mnt.exists and mnt.filesystem == "tmpfs"


def test_check_mode_deleted_nothing(host):
    files = json.loads(host.file("/root/models_after_check_mode.json").content_string)
    assert len(files) == 5 and any(f.startswith(OLD) for f in files)


def test_frees_exactly_enough_and_keeps_what_is_in_use(host):
    assert host.file(INUSE).is_directory  # served by an active unit
    assert host.file(NEWER).is_directory  # deleting it too would be more than needed
    assert not host.file(OLD).exists      # the least recently used one covers the shortfall
    assert not host.file("/models/acme--old").exists  # its empty org folder went with it
    out = _outcome(host)
    plan = out["plan"]
    assert [d["path"] for d in plan["delete"]] == [OLD]
    assert {"path": INUSE, "reason": "in use by a live unit or a running process"} in plan["refused"]
    users = {(u["path"], u["kind"]) for u in plan["in_use"]}
    assert (INUSE, "unit") in users and (CTR, "unit") in users and (NOHUP, "process") in users
    assert {"path": NOHUP, "reason": "in use by a live unit or a running process"} in plan["refused"]
    assert {"path": CTR, "reason": "in use by a live unit or a running process"} in plan["refused"]
    assert DATASETS in plan["not_models"]
    assert any(r["path"] == DATASETS and r["reason"].startswith("not a model") for r in plan["refused"])
    for kept in (NOHUP, CTR, DATASETS):  # older than OLD: without the guards they would have gone first
        assert host.file(kept).is_directory, kept
    assert host.file(DATASETS + "/train-00000.parquet").size == 4 * 2**20
    assert plan["shortfall_bytes"] > 0 and plan["delete"][0]["bytes"] >= plan["shortfall_bytes"]
    # the model held 20 MiB of real blocks
    assert plan["delete"][0]["bytes"] >= 20 * 2**20


def test_figures_match_df_to_the_byte(host):
    out = _outcome(host)
    df = int(host.check_output("df --output=avail -B1 /models | tail -n 1").strip())
    assert out["free_bytes_after"] == df
    assert out["plan"]["figures"]["free"]["bytes"] == out["plan"]["free_bytes"]
    assert out["plan"]["required_bytes"] == REQUIRED


def test_deletion_logged(host):
    lines = host.file("/var/log/modelfleet/storage.log").content_string.strip().splitlines()
    recs = [json.loads(x) for x in lines]
    assert [r["path"] for r in recs] == [OLD]  # once: the second converge deleted nothing
    assert recs[0]["bytes"] >= 20 * 2**20 and recs[0]["time"].endswith("Z")
