"""The fetch modules run by Ansible on this machine against the local hub (real olah + the real
huggingface_hub client): interruption at random points, corruption, stalls, secrets, bad input."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import flock
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import model_paths, verify_entry

from modelfleet.harness.servers import hub_reset, hub_stats
from tests.conftest import TINY_REPO, ansible_module, run_local_play

TOKEN = "hf_dummyTOKEN_for_the_secrecy_test_4b1d"


def lock_for(hub, root, revision="v1"):
    rc, res, _ = ansible_module("hf_lock", {"repo_id": TINY_REPO, "revision": revision, "endpoint": hub.url,
                                            "root": str(root)})
    assert rc == 0, res
    return res["lock"]


@pytest.fixture
def token_file(tmp_path):
    f = tmp_path / "hf-token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


@pytest.fixture
def slow_hub(hub):
    hub.extra["rate_file"].write_text(str(15_000))  # bytes/s per response: a slow link
    yield hub
    hub.extra["rate_file"].unlink()
    hub.extra["stall_file"].unlink(missing_ok=True)


def _fetched_paths(hub) -> set[str]:
    return {p.rsplit("/", 1)[1] for p, b in hub_stats(hub.url)["by_path"].items() if b > 0}


def _complete_in_staging(staging, lock) -> set[str]:
    return {e["name"] for e in lock["files"] if os.path.exists(os.path.join(staging, e["name"]))
            and verify_entry(staging, e)["ok"]}


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(d))
    return kids


def _kill_all(proc):
    """Kill the whole fetch as a crash would: the ansible controller, its workers (each in its own
    session, so not in the controller's process group), the module (watchdog) and its download child.
    The tree is frozen first (SIGSTOP, repeated until no new process appears), then killed, so a worker
    that was just starting the module cannot live on as a second writer."""
    _kill_tree(proc.pid)
    proc.wait(10)


def test_resume_after_random_kills(slow_hub, tmp_path, token_file):
    hub = slow_hub
    root = tmp_path / "models"
    lock = lock_for(hub, root)
    paths = model_paths(str(root), TINY_REPO, lock["revision"])
    args = {"root": str(root), "lock": lock, "endpoint": hub.url, "max_workers": 2, "token_file": str(token_file)}
    rng = random.Random()
    seen_ps = []
    kills = 0
    for _ in range(6):
        done_before = _complete_in_staging(paths["staging"], lock)
        if len(done_before) == len(lock["files"]) or os.path.exists(paths["final"]):
            break
        hub_reset(hub.url)
        proc = ansible_module("hf_snapshot", args, popen=True)
        time.sleep(rng.uniform(1.0, 3.0))
        seen_ps.append(subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout)
        _kill_all(proc)
        kills += 1
        again = _fetched_paths(hub) & done_before
        assert not again, f"re-fetched files that were already complete: {again}"
    assert kills >= 5, "the transfer finished before it could be interrupted 5 times"
    hub_reset(hub.url)
    done_before = _complete_in_staging(paths["staging"], lock)
    rc, res, out = ansible_module("hf_snapshot", args)
    assert rc == 0, out[-3000:]
    assert not (_fetched_paths(hub) & done_before)
    if not res.get("already_complete"):
        assert set(res["kept"]) == done_before
        assert set(res["fetched"]) == {e["name"] for e in lock["files"]} - done_before
    for e in lock["files"]:
        assert verify_entry(paths["final"], e)["ok"], e["name"]
    assert os.path.exists(os.path.join(paths["final"], ".modelfleet", "complete"))
    for ps in seen_ps:
        assert TOKEN not in ps
    assert TOKEN not in out
    for dirpath, _d, files in os.walk(root):
        for f in files:
            assert TOKEN.encode() not in open(os.path.join(dirpath, f), "rb").read(), f


def test_second_fetch_of_the_same_model_is_refused_while_one_runs(slow_hub, tmp_path):
    """Two writers on one staging tree (a rerun while an earlier detached job still downloads) would race
    on the final rename; the second is refused at once, names the first, and changes nothing."""
    hub = slow_hub
    root = tmp_path / "models"
    lock = lock_for(hub, root)
    paths = model_paths(str(root), TINY_REPO, lock["revision"])
    args = {"root": str(root), "lock": lock, "endpoint": hub.url, "max_workers": 2}
    first = ansible_module("hf_snapshot", args, popen=True)
    try:
        deadline = time.monotonic() + 60
        st = {}
        while time.monotonic() < deadline:
            try:
                st = json.load(open(paths["status"]))
            except (OSError, ValueError):
                st = {}
            if st.get("state") == "downloading":
                break
            time.sleep(0.2)
        assert st.get("state") == "downloading", st
        before = sorted(os.listdir(paths["staging"]))
        rc, res, out = ansible_module("hf_snapshot", args)
        assert rc != 0
        assert f"another fetch (pid {st['watchdog_pid']})" in res["msg"], res["msg"]
        assert "downloading" in res["msg"] and "nothing was changed" in res["msg"]
        assert first.poll() is None, "the first fetch was disturbed"
        assert set(before) <= set(os.listdir(paths["staging"]))
        hub.extra["rate_file"].write_text(str(5_000_000))
        out1, _ = first.communicate(timeout=300)
        assert first.returncode == 0, out1[-3000:]
    finally:
        if first.poll() is None:
            _kill_all(first)
    for e in lock["files"]:
        assert verify_entry(paths["final"], e)["ok"], e["name"]
    rc, res, out = ansible_module("hf_snapshot", args)  # the lock went with the first fetch
    assert rc == 0 and res["already_complete"], out[-2000:]


def test_corrupted_byte_is_detected_and_only_that_file_refetched(hub, tmp_path):
    root = tmp_path / "models"
    lock = lock_for(hub, root)
    args = {"root": str(root), "lock": lock, "endpoint": hub.url}
    rc, res, out = ansible_module("hf_snapshot", args)
    assert rc == 0, out
    paths = model_paths(str(root), TINY_REPO, lock["revision"])
    victim = os.path.join(paths["final"], "model-00002-of-00003.safetensors")
    with open(victim, "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0xFF]))
    rc, res, _ = ansible_module("hf_verify", {"root": str(root), "lock": lock, "level": "full", "reopen_bad": True})
    assert rc == 0 and res["reopened"] and res["verify"]["bad"][0]["name"] == "model-00002-of-00003.safetensors"
    assert "sha256" in res["verify"]["bad"][0]["reason"]
    assert not os.path.exists(os.path.join(paths["final"], ".modelfleet", "complete"))
    hub_reset(hub.url)
    rc, res, out = ansible_module("hf_snapshot", args)
    assert rc == 0, out
    assert res["fetched"] == ["model-00002-of-00003.safetensors"]
    assert _fetched_paths(hub) == {"model-00002-of-00003.safetensors"}
    assert res["verify"]["mb_per_s"] > 0
    for e in lock["files"]:
        assert verify_entry(paths["final"], e)["ok"]


@pytest.mark.parametrize("xet", [False, True], ids=["xet-off", "xet-on"])
def test_the_download_child_takes_xet_only_when_asked_with_its_cache_in_staging(hub, tmp_path, xet):
    """What the hub client in the download child was set to do, as huggingface_hub itself reports it there. A Xet
    cache the user's environment points elsewhere is not used: off means off, on means the staging folder."""
    root = tmp_path / "models"
    lock = lock_for(hub, root)
    args = {"root": str(root), "lock": lock, "endpoint": hub.url}
    if xet:
        args.update(xet=True, xet_cache_bytes=4 * 2**20)
    elsewhere = tmp_path / "home-xet-cache"
    rc, res, out = ansible_module("hf_snapshot", args, extra_env={"HF_XET_CACHE": str(elsewhere),
                                                                  "HF_HUB_DISABLE_XET": "0"})
    assert rc == 0, out
    paths = model_paths(str(root), TINY_REPO, lock["revision"])
    transfer = res["download"]["transfer"]
    if xet:
        assert transfer == {"xet": True, "xet_cache": os.path.join(paths["staging"], ".cache", "xet"),
                            "xet_chunk_cache_bytes": 4 * 2**20}
    else:
        assert transfer == {"xet": False, "xet_cache": None, "xet_chunk_cache_bytes": None}
    with open(paths["status"]) as f:
        assert json.load(f).get("transfer", transfer) == transfer
    assert not elsewhere.exists()
    # the harness hub serves LFS over plain HTTP, so the files came that way either way, and were verified
    assert not os.path.exists(os.path.join(paths["final"], ".cache"))
    for e in lock["files"]:
        assert verify_entry(paths["final"], e)["ok"]


def test_stall_watchdog_restarts_then_fails_clearly(slow_hub, tmp_path):
    hub = slow_hub
    root = tmp_path / "models"
    lock = lock_for(hub, root)
    hub.extra["stall_file"].write_text("")
    rc, res, out = ansible_module("hf_snapshot", {"root": str(root), "lock": lock, "endpoint": hub.url,
                                                  "stall_seconds": 2, "max_stalls": 2})
    assert rc != 0
    assert "stalled or failed 3 times" in res["msg"] and "no new bytes for 2 s" in res["msg"]
    paths = model_paths(str(root), TINY_REPO, lock["revision"])
    assert not os.path.exists(paths["final"])  # nothing half-written presented as complete
    assert json.load(open(paths["status"]))["state"] == "failed"


ROLE_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: modelfleet.fleet.hf_fetch
      vars:
        hf_fetch_repo_id: {repo}
        hf_fetch_revision: v1
        hf_fetch_root: {root}
        hf_fetch_endpoint: {endpoint}
        hf_fetch_venv: {venv}
        hf_fetch_stall_seconds: 2
        hf_fetch_max_stalls: 1
        hf_fetch_poll_seconds: 1
"""


def test_the_role_fails_with_the_downloads_own_reason(slow_hub, tmp_path):
    """The role watches the detached download (fetch_watch reads its job); when the download fails, the play fails with
    the download's own message (a failed_when on the watch once hid it: the play went on to a vaguer error)."""
    hub = slow_hub
    hub.extra["stall_file"].write_text("")
    root = tmp_path / "models"
    play = tmp_path / "play.yml"
    # the fetch venv is this one (it holds the pinned huggingface_hub, so the role installs nothing)
    play.write_text(ROLE_PLAY.format(repo=TINY_REPO, root=root, endpoint=hub.url, venv=sys.prefix))
    r = run_local_play(play)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0, out[-2000:]
    assert "hf_fetch on localhost: " in out and "stalled or failed 2 times" in out, out[-3000:]
    assert not list(root.glob("*/*/.modelfleet/complete"))


def _ppid(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def test_the_watch_fails_when_the_downloads_process_is_gone(slow_hub, tmp_path):
    """A download killed together with Ansible's async wrapper (`pkill -f hf_snapshot` matches both; so does the
    out-of-memory killer taking the group; so does a host restart) never finishes its job: the watch waited for it
    until hf_fetch_timeout_seconds (24 hours). It fails once the model's write lock has been free for the stall
    time, with what happened, and nothing is marked complete."""
    hub = slow_hub
    root = tmp_path / "models"
    play = tmp_path / "play.yml"
    play.write_text(ROLE_PLAY.format(repo=TINY_REPO, root=root, endpoint=hub.url, venv=sys.prefix))
    lock = lock_for(hub, root)
    paths = model_paths(str(root), TINY_REPO, lock["revision"])
    proc = run_local_play(play, popen=True)
    try:
        deadline = time.monotonic() + 120
        while flock.holder(paths["flock"]) is None:  # the download has started
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        # killed at once: the watch may never see it hold the lock, but the lock file says it was taken after the
        # job started, so the stall time applies (2 s), not the 60 s a writer that may still be starting gets
        module = int(flock.holder(paths["flock"]))
        top = module  # up to the async wrapper's daemon: everything of the job, and nothing of the play
        while "async_wrapper" in open(f"/proc/{_ppid(top)}/cmdline").read().replace("\0", " "):
            top = _ppid(top)
        assert top != module, "the module does not run under Ansible's async wrapper"
        _kill_tree(top)
        t = time.monotonic()
        out, _ = proc.communicate(timeout=120)  # before: waited until the job's timeout
    finally:
        if proc.poll() is None:
            _kill_all(proc)
    out = " ".join(out.split())
    assert proc.returncode != 0, out[-2000:]
    assert "hf_fetch on localhost: its process is gone - the job never finished" in out, out[-3000:]
    assert "nothing was marked complete" in out
    assert time.monotonic() - t < 45, "the watch took longer than its stall time and a few polls"
    assert not os.path.exists(paths["final"])


def _kill_tree(top: int) -> None:
    """SIGKILL `top` and every process below it, frozen first (SIGSTOP, repeated until no new process appears)
    so none escapes by forking."""
    frozen: set[int] = set()
    while True:
        kids, todo, tree = _children(), [top], set()
        while todo:
            pid = todo.pop()
            if pid not in tree:
                tree.add(pid)
                todo += kids.get(pid, [])
        new = tree - frozen
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        frozen |= new
    for pid in frozen:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("repo,rev,needle", [
    ("modelfleet-test/nope", "main", "repository not found"),
    (TINY_REPO, "no-such-branch", "revision 'no-such-branch' not found"),
])
def test_lock_errors(hub, tmp_path, repo, rev, needle):
    rc, res, _ = ansible_module("hf_lock", {"repo_id": repo, "revision": rev, "endpoint": hub.url,
                                            "root": str(tmp_path)})
    assert rc != 0 and needle in res["msg"]


def test_endpoint_down(tmp_path):
    rc, res, _ = ansible_module("hf_lock", {"repo_id": TINY_REPO, "endpoint": "http://127.0.0.1:9",
                                            "root": str(tmp_path)})
    assert rc != 0 and "cannot reach the hub" in res["msg"]


def test_hub_down_mid_fetch_leaves_nothing_complete(hub, tmp_path):
    root = tmp_path / "models"
    lock = lock_for(hub, root)
    hub.extra["fail_file"].write_text("")
    try:
        rc, res, _ = ansible_module("hf_snapshot", {"root": str(root), "lock": lock, "endpoint": hub.url,
                                                    "stall_seconds": 5, "max_stalls": 1})
    finally:
        hub.extra["fail_file"].unlink()
    assert rc != 0 and "stalled or failed" in res["msg"]
    assert not os.path.exists(model_paths(str(root), TINY_REPO, lock["revision"])["final"])


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, f"this test mounts a tmpfs and needs root: {r.stderr}"
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_no_space(hub, small_fs):
    lock = lock_for(hub, small_fs)
    rc, res, _ = ansible_module("hf_snapshot", {"root": str(small_fs), "lock": lock, "endpoint": hub.url,
                                                "stall_seconds": 5, "max_stalls": 1})
    assert rc != 0
    assert not os.path.exists(model_paths(str(small_fs), TINY_REPO, lock["revision"])["final"])


def test_unwritable_target(hub, small_fs):
    lock = lock_for(hub, small_fs)
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    rc, res, _ = ansible_module("hf_snapshot", {"root": str(small_fs), "lock": lock, "endpoint": hub.url})
    assert rc != 0 and ("Read-only" in res["msg"] or "not writable" in res["msg"]), res["msg"]
