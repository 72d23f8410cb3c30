"""hf_fetch outcome on both hosts: the pinned commit's files, verified, lock file, completion marker,
owner and modes; the origin fetched from the hub, the other received from the origin."""

import hashlib
import json

V1 = "57acd6fa976d1848528c6ee94458c99f479b17bf"  # tag v1 of the harness's tiny model (deterministic)
FINAL = f"/models/modelfleet-test--tiny-llama/{V1}"
TOKEN = "dummy-token-for-secrecy-test-7f3a9c"


def test_model_in_place_with_lock_and_marker(host):
    assert host.file(FINAL).is_directory
    lock = json.loads(host.file(f"{FINAL}/.modelfleet/lock.json").content_string)
    assert lock["revision"] == V1 and lock["requested_revision"] == "v1"
    marker = host.file(f"{FINAL}/.modelfleet/complete")
    assert marker.exists and json.loads(marker.content_string)["revision"] == V1
    for f in lock["files"]:
        fh = host.file(f"{FINAL}/{f['name']}")
        assert fh.exists and fh.size == f["size"], f["name"]
        assert fh.user == "root" and fh.mode == 0o644
        if f["sha256"]:
            assert fh.sha256sum == f["sha256"]
    assert not host.file(f"{FINAL}/.cache").exists
    assert not host.file(f"/models/.staging/modelfleet-test--tiny-llama/{V1}").exists


def test_git_blob_ids_match_for_small_files(host):
    lock = json.loads(host.file(f"{FINAL}/.modelfleet/lock.json").content_string)
    cfg = next(f for f in lock["files"] if f["name"] == "config.json")
    data = host.file(f"{FINAL}/config.json").content
    assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == cfg["blob_id"]


def test_where_it_came_from(host):
    out = json.loads(host.file("/root/fetch_outcome.json").content_string)
    assert out["revision"] == V1
    name = host.backend.get_hostname()
    assert out["source"] == ("hub" if name == "fetch-origin" else "origin fetch-origin")


def test_token_is_root_only_and_nowhere_else(host):
    if host.backend.get_hostname() == "fetch-origin":
        t = host.file("/etc/modelfleet/hf-token")
        assert t.mode == 0o600 and t.user == "root"
    hits = host.run(f"grep -rl {TOKEN} /models /etc/systemd /var/log /root/fetch_outcome.json 2>/dev/null")
    assert hits.stdout.strip() == ""
    journal = host.run(f"journalctl --no-pager 2>/dev/null | grep -c {TOKEN}")
    assert journal.stdout.strip() in ("0", "")


def test_hub_served_one_copy_for_the_fleet(host):
    """Hub egress for two hosts is one copy: the origin downloaded, the other received from it."""
    import os
    import urllib.request

    if host.backend.get_hostname() != "fetch-node":
        return
    state = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "hub")
    endpoint = open(os.path.join(state, "endpoint")).read().strip()
    stats = json.loads(urllib.request.urlopen(endpoint + "/_modelfleet/stats").read())
    lock = json.loads(host.file(f"{FINAL}/.modelfleet/lock.json").content_string)
    assert stats["bytes_served"] == lock["total_bytes"]


def test_the_fetch_left_no_async_job_file(host):
    """The hub download runs as an async job, whose results file (~/.ansible_async/<jid>) stayed behind on the
    host after every fetch; the watch removes it once it has read the job's answer."""
    left = host.run("find /root/.ansible_async -type f 2>/dev/null")
    assert left.stdout.strip() == "", left.stdout
