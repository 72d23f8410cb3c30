"""storage_cleanup on a 64 MiB tmpfs with three models: it frees exactly enough (the least recently
used model that is not in use), keeps the in-use one, reports figures that match df to the byte,
check mode deleted nothing, and the log records what went."""

import json

INUSE = "/models/acme--inuse/1111111111111111111111111111111111111111"
OLD = "/models/acme--old/2222222222222222222222222222222222222222"
NEWER = "/models/acme--newer/3333333333333333333333333333333333333333"
REQUIRED = 26214400


def _outcome(host):
    return json.loads(host.file("/root/storage_outcome.json").content_string)


def test_models_is_a_real_small_filesystem(host):
    mnt = host.mount_point("/models")
    assert mnt.exists and mnt.filesystem == "tmpfs"


def test_check_mode_deleted_nothing(host):
    files = json.loads(host.file("/root/models_after_check_mode.json").content_string)
    assert len(files) == 3 and any(f.startswith(OLD) for f in files)


def test_frees_exactly_enough_and_keeps_what_is_in_use(host):
    assert host.file(INUSE).is_directory  # served by an active unit
    assert host.file(NEWER).is_directory  # deleting it too would be more than needed
    assert not host.file(OLD).exists      # the least recently used one covers the shortfall
    assert not host.file("/models/acme--old").exists  # its empty org folder went with it
    out = _outcome(host)
    plan = out["plan"]
    assert [d["path"] for d in plan["delete"]] == [OLD]
    assert {"path": INUSE, "reason": "in use by an active unit"} in plan["refused"]
    assert plan["active_units"][0]["model"] == INUSE
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
