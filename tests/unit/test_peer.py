"""Peer distribution (issue 23): the chain/tree rule, and real pulls with the real rsync between folders that stand
for hosts (the SSH transport and rrsync are exercised by molecule/fleet and benchmarks/bench_distribute.py): a file
is served onwards only once verified, a child starts a file as soon as its parent has it, a bad copy is caught and
its source dropped, a stalled source is left for the next, a killed pull resumes, and only a tree whose files
still match their records is marked complete."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import peer
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import (
    build_lock,
    finalize,
    is_complete,
    model_paths,
)

COMMIT = "57acd6fa976d1848528c6ee94458c99f479b17bf"
REPO = "org/tiny"


def test_chain_gives_each_host_its_parent_then_the_ancestors_up_to_the_origin():
    assert peer.plan("o", ["a", "b", "c"]) == {"a": ["o"], "b": ["a", "o"], "c": ["b", "a", "o"]}


def test_tree_of_fanout_two():
    got = peer.plan("o", ["a", "b", "c", "d", "e"], fanout=2)
    assert got == {"a": ["o"], "b": ["o"], "c": ["a", "o"], "d": ["a", "o"], "e": ["b", "o"]}
    assert peer.served_by(got) == {"o": ["a", "b", "c", "d", "e"], "a": ["c", "d"], "b": ["e"]}


@pytest.mark.parametrize("fanout", [0, -1, True, "2", 1.5])
def test_bad_fanout_is_refused(fanout):
    with pytest.raises(peer.PeerError, match="fanout must be an integer >= 1"):
        peer.plan("o", ["a"], fanout=fanout)


def test_a_host_twice_is_refused():
    with pytest.raises(peer.PeerError, match="'o' appears twice"):
        peer.plan("o", ["a", "o"])
    with pytest.raises(peer.PeerError, match="'a' appears twice"):
        peer.plan("o", ["a", "a"])


def test_sources_name_each_host_as_the_others_reach_it_and_only_the_origin_complete():
    reach = {"o": {"address": "10.0.0.1", "port": "2222", "root": "/models"},
             "a": {"address": "10.0.0.2", "port": 22, "root": "/srv/models"}}
    got = peer.source_entries(["a", "o"], reach, "modelfleet-peer", "o")
    assert got == [
        {"host": "a", "address": "10.0.0.2", "port": 22, "user": "modelfleet-peer", "root": "/srv/models",
         "complete": False},
        {"host": "o", "address": "10.0.0.1", "port": 2222, "user": "modelfleet-peer", "root": "/models",
         "complete": True}]


@pytest.mark.parametrize("reach,needle", [
    ({}, "has no address and models root"),
    ({"a": {"address": "", "root": "/models"}}, "has no address"),
    ({"a": {"address": "h", "root": "/models", "port": "ssh"}}, "port 'ssh' is not a number"),
])
def test_a_source_that_cannot_be_reached_is_named(reach, needle):
    with pytest.raises(peer.PeerError, match=needle):
        peer.source_entries(["a"], reach, "u", "o")


def test_a_control_folder_too_long_for_a_socket_is_refused_before_any_transfer(tmp_path):
    lock = {"repo_id": REPO, "revision": COMMIT, "files": [], "total_bytes": 0}
    src = {"host": "a", "address": "10.0.0.2", "root": "/models", "ssh": {"control_dir": "/run/" + "x" * 60}}
    with pytest.raises(peer.PeerError, match="108-byte limit"):
        peer.pull(root=str(tmp_path), lock=lock, sources=[src])
    assert not (tmp_path / ".staging").exists()


def test_ssh_command_confines_to_the_key_known_hosts_and_relative_paths():
    src = {"host": "h1", "address": "10.0.0.1", "port": 2222, "user": "modelfleet-peer", "root": "/models"}
    cmd = peer.rsync_command(src, "org--m/c/f.bin", "/tmp/x", key="/run/k", known_hosts="/run/kh", control_dir="/run/c")
    assert cmd[0] == "rsync" and "--append-verify" in cmd
    assert cmd[-2:] == ["modelfleet-peer@10.0.0.1:org--m/c/f.bin", "/tmp/x"]
    ssh = cmd[cmd.index("-e") + 1]
    for part in ("-p 2222", "-i /run/k", "UserKnownHostsFile=/run/kh", "StrictHostKeyChecking=yes", "BatchMode=yes",
                 "ControlPath=/run/c/s-%C"):
        assert part in ssh
    # a session of several files goes over a connection of its own (not behind another session's bulk data)
    cmd = peer.rsync_command(src, "org--m/c", "/tmp/d", control_dir="/run/c", files_from="/tmp/l", connection="1")
    assert cmd[-2:] == ["modelfleet-peer@10.0.0.1:org--m/c/", "/tmp/d/"] and "--files-from=/tmp/l" in cmd
    assert "ControlPath=/run/c/1-%C" in cmd[cmd.index("-e") + 1]


# --------------------------------------------------------------------------- real pulls between folders
def _origin(tmp_path, sizes=(300_000, 5, 70_000, 1)):
    """A complete model on an 'origin' folder, and its lock."""
    root = str(tmp_path / "origin")
    files = []
    staging = model_paths(root, REPO, COMMIT)["staging"]
    os.makedirs(os.path.join(staging, "sub"), exist_ok=True)
    for i, n in enumerate(sizes):
        name = f"sub/f{i}.bin" if i == 2 else f"f{i}.safetensors"
        data = os.urandom(n)
        with open(os.path.join(staging, name), "wb") as f:
            f.write(data)
        files.append({"name": name, "size": n, "sha256": hashlib.sha256(data).hexdigest()})
    lock = build_lock(REPO, "main", COMMIT, files, [], "http://hub")
    finalize(staging, model_paths(root, REPO, COMMIT)["final"], lock)
    return root, lock


def _src(host, root, complete=False):
    return {"host": host, "address": "", "root": root, "complete": complete}


def _batch(cmd):
    """The files an rsync session of a pull moves (its --files-from list), or [] for a status read."""
    arg = next((a for a in cmd if a.startswith("--files-from=")), None)
    if arg is None:
        return []
    return [n.decode() for n in open(arg.split("=", 1)[1], "rb").read().split(b"\0") if n]


def _files(root, lock, where="staging"):
    base = model_paths(root, REPO, COMMIT)[where]
    return {e["name"]: open(os.path.join(base, e["name"]), "rb").read() for e in lock["files"]}


def test_pull_from_the_origin_verifies_records_and_finalizes(tmp_path):
    oroot, lock = _origin(tmp_path)
    root = str(tmp_path / "a")
    res = peer.pull(root=root, lock=lock, sources=[_src("o", oroot, complete=True)], poll_seconds=0.05)
    assert res["bytes_moved"] == lock["total_bytes"] and res["sources"] == ["o"] and res["dropped"] == []
    st = json.load(open(model_paths(root, REPO, COMMIT)["status"]))
    assert st["state"] == "received" and st["verified"] == sorted(e["name"] for e in lock["files"])
    assert _files(root, lock) == _files(oroot, lock, "final")
    out = peer.finalize_recorded(root=root, lock=lock)
    assert out["bytes_hashed"] == 0, "every file was hashed once, as it arrived"
    assert is_complete(model_paths(root, REPO, COMMIT)["final"], COMMIT)
    st = json.load(open(model_paths(root, REPO, COMMIT)["status"]))
    assert st["state"] == "complete" and st["via"] == "peer" and st["sources"] == ["o"] and st["dropped"] == []


def test_a_chain_is_pipelined_child_takes_files_from_its_parent_as_they_are_verified(tmp_path):
    oroot, lock = _origin(tmp_path, sizes=(300_000, 5, 300_000, 1))
    aroot, broot = str(tmp_path / "a"), str(tmp_path / "b")
    begun_by_b, b_sessions, a_ended = [], [], []

    def a_rsync(cmd, timeout, **kw):  # the parent's link: 300 KB/s, so the child must wait on its status
        r = peer.run_rsync([cmd[0], "--bwlimit=300", *cmd[1:]], timeout, **kw)
        a_ended.append(time.monotonic())
        return r

    def b_rsync(cmd, timeout, on_line=None, **kw):
        if on_line is None:  # a status read
            return peer.run_rsync(cmd, timeout, **kw)
        b_sessions.append(cmd[-2])

        def line(text):
            begun_by_b.append((time.monotonic(), text))
            on_line(text)
        return peer.run_rsync(cmd, timeout, on_line=line, **kw)

    out = {}
    ta = threading.Thread(target=lambda: out.setdefault("a", peer.pull(
        root=aroot, lock=lock, sources=[_src("o", oroot, True)], poll_seconds=0.02, rsync=a_rsync)))
    ta.start()
    res_b = peer.pull(root=broot, lock=lock, sources=[_src("a", aroot), _src("o", oroot, True)],
                      poll_seconds=0.02, stall_seconds=5, rsync=b_rsync)
    ta.join()
    assert res_b["sources"] == ["a"], "the child took every file from its parent, none from the origin"
    assert b_sessions and all(aroot in src for src in b_sessions)
    assert _files(broot, lock) == _files(oroot, lock, "final")
    # pipelined: the child began its first file before the parent had its last, and each file once
    assert len(a_ended) == 1 and begun_by_b[0][0] < a_ended[0]
    assert sorted(n for _t, n in begun_by_b if not n.endswith("/")) == sorted(e["name"] for e in lock["files"])


def test_the_files_a_source_has_move_in_one_session(tmp_path):
    """A session's start is several round trips (the SSH channel, rrsync, rsync's handshake); on a link whose
    queue is full they cost a good part of a file's time, once per file when each file was its own session (the
    first hop of a 64-shard model: 206 s against 164 s of link time at 25 Mbit/s). The origin's files move in one
    session, and a parent's in one per status read that listed them."""
    oroot, lock = _origin(tmp_path)
    sessions = []

    def rsync(cmd, timeout, **kw):
        if _batch(cmd):
            sessions.append(_batch(cmd))
        return peer.run_rsync(cmd, timeout, **kw)

    res = peer.pull(root=str(tmp_path / "a"), lock=lock, sources=[_src("o", oroot, True)], poll_seconds=0.02,
                    rsync=rsync)
    assert sessions == [[e["name"] for e in lock["files"]]] and res["dropped"] == []
    proot = _peer_holding(tmp_path, oroot, lock, "p")
    sessions.clear()
    res = peer.pull(root=str(tmp_path / "c"), lock=lock, sources=[_src("p", proot), _src("o", oroot, True)],
                    poll_seconds=0.02, rsync=rsync)
    assert sessions == [[e["name"] for e in lock["files"]]] and res["sources"] == ["p"]
    assert _files(str(tmp_path / "c"), lock) == _files(oroot, lock, "final")


def _over_ssh(cmd, root):
    """The local form of a pull's rsync command for a source reached over SSH (its `user@address:path` read from
    `root`), and the SSH connection (ControlPath) it would have gone over."""
    e = cmd.index("-e")
    ssh = cmd[e + 1]
    path = ssh.split("ControlPath=", 1)[1].split()[0]
    remote = cmd[-2].split(":", 1)[1]
    return [*cmd[:e], *cmd[e + 2:-2], os.path.join(root, remote), cmd[-1]], os.path.basename(path)


def test_the_next_session_starts_beside_the_last_file_of_the_one_before(tmp_path):
    """The link should not idle for a session's start between two sessions: when a session's last file is about to
    be whole, the source's status is read again, and a session for what the source listed since starts beside it.
    Not earlier: each read is a round trip and a process on the source, and two files moving at once each take
    twice as long to be whole (and served onwards). Reads and the two sessions go over SSH connections of their own:
    multiplexed over one, each waited behind the bulk data already in that connection's buffers."""
    oroot, lock = _origin(tmp_path)
    names = [e["name"] for e in lock["files"]]
    first = names[0]  # 300 KB
    proot = _peer_holding(tmp_path, oroot, lock, "p")
    st_path = model_paths(proot, REPO, COMMIT)["status"]

    def parent_lists(verified, at):
        with open(st_path + ".tmp", "w") as f:
            json.dump({"state": "receiving", "revision": COMMIT, "verified": verified, "updated_at": at}, f)
        os.replace(st_path + ".tmp", st_path)

    parent_lists([first], 1)
    spans, reads = [], []  # (files, began, ended, connection); (when, connection)

    def rsync(cmd, timeout, on_line=None, **kw):
        cmd, conn = _over_ssh(cmd, proot)
        if on_line is None:
            reads.append((time.monotonic(), conn))
            return peer.run_rsync(cmd, timeout, **kw)
        files, t = _batch(cmd), time.monotonic()
        if files == [first]:  # 4 s at 75 KB/s; the parent verifies the other files 0.5 s in
            threading.Timer(0.5, parent_lists, (names, 2)).start()
            cmd = [cmd[0], "--bwlimit=75", *cmd[1:]]
        r = peer.run_rsync(cmd, timeout, on_line=on_line, **kw)
        spans.append((files, t, time.monotonic(), conn))
        return r

    p = {"host": "p", "address": "10.0.0.2", "root": "/models", "ssh": {"control_dir": "/run/modelfleet-test"}}
    res = peer.pull(root=str(tmp_path / "c"), lock=lock, sources=[p, _src("o", oroot, True)], poll_seconds=0.05,
                    rsync=rsync)
    assert res["sources"] == ["p"] and res["dropped"] == []
    (a, a0, a1, ca), (b, b0, _b1, cb) = sorted(spans, key=lambda x: x[1])
    assert a == [first] and sorted(b) == sorted(names[1:])
    assert b0 < a1 - 0.3, "the next session began while the one before still moved its last file"
    assert b0 > a0 + 2.0, "and not long before that file was whole"
    assert not [t for t, _c in reads if a0 + 0.5 < t < a0 + 2.0], "no status read while the file was far from whole"
    assert {c for _t, c in reads} == {"s-%C"} and ca != cb and {ca, cb} <= {"0-%C", "1-%C"}
    assert _files(str(tmp_path / "c"), lock) == _files(oroot, lock, "final")


def test_a_file_is_hashed_while_the_next_one_moves_and_served_onwards_as_soon_as_it_matched(tmp_path):
    """One hop moves files at the rate of the slower of its link and its hash, not of the two one after the other
    (on a 100 GbE link sha256 at ~1.5 GB/s per core is as slow as rsync itself). A file must be hashed, and listed
    as verified (served onwards), while the file after it still moves in the same session: code that hashes after
    the session, or that keeps a hashed file until the transfer after it ended, fails the assertions."""
    oroot, lock = _origin(tmp_path, sizes=(200_000, 150_000, 100_000))
    root = str(tmp_path / "a")
    status_path = model_paths(root, REPO, COMMIT)["status"]
    files_dir = os.path.join(model_paths(root, REPO, COMMIT)["staging"], ".cache", "peer", "files")
    order = []  # the files in the order rsync began them
    hashed_while_next_moved, listed, whole = [], {}, {}
    sizes = {e["name"]: e["size"] for e in lock["files"]}

    def rsync(cmd, timeout, on_line=None, **kw):  # 200 KB/s: each file takes 0.5-1 s
        if on_line is None:
            return peer.run_rsync(cmd, timeout, **kw)

        def line(text):
            if text in sizes:  # not the folder sub/
                order.append(text)
            on_line(text)
        return peer.run_rsync([cmd[0], "--bwlimit=200", *cmd[1:]], timeout, on_line=line, **kw)

    def digest(path, algo):
        name = os.path.relpath(path, files_dir)
        i = order.index(name)
        if i + 1 < len(order) and order[i + 1] not in whole:
            hashed_while_next_moved.append(name)
        return peer.file_digest(path, algo)

    done = threading.Event()

    def watch():  # when each file is listed verified, and when each is whole (here or already in staging)
        while not done.is_set():
            t = time.monotonic()
            try:
                for v in json.load(open(status_path))["verified"]:
                    listed.setdefault(v, t)
            except (OSError, ValueError):
                pass
            for n, size in sizes.items():
                p = os.path.join(files_dir, n)
                if n not in whole and (n in listed or (os.path.exists(p) and os.path.getsize(p) == size)):
                    whole[n] = t
            time.sleep(0.005)

    w = threading.Thread(target=watch)
    w.start()
    try:
        res = peer.pull(root=root, lock=lock, sources=[_src("o", oroot, True)], poll_seconds=0.02, rsync=rsync,
                        digest=digest)
    finally:
        done.set()
        w.join()
    assert order == sorted(sizes) and res["dropped"] == []
    assert hashed_while_next_moved == order[:-1], "each file but the last was hashed while the next one moved"
    assert all(listed[order[i]] < whole[order[i + 1]] for i in range(len(order) - 1)), \
        "a matched file was served onwards before the file after it was whole"
    assert _files(root, lock) == _files(oroot, lock, "final")


def _peer_holding(tmp_path, oroot, lock, name, missing=()):
    """A peer whose staging holds the model's files (but `missing`) and whose status lists every file verified."""
    import shutil

    proot = str(tmp_path / name)
    staging = model_paths(proot, REPO, COMMIT)["staging"]
    os.makedirs(os.path.dirname(staging), exist_ok=True)
    shutil.copytree(model_paths(oroot, REPO, COMMIT)["final"], staging)
    for m in missing:
        os.unlink(os.path.join(staging, m))
    st = model_paths(proot, REPO, COMMIT)["status"]
    os.makedirs(os.path.dirname(st), exist_ok=True)
    json.dump({"state": "receiving", "revision": COMMIT, "verified": [e["name"] for e in lock["files"]],
               "updated_at": 1}, open(st, "w"))
    return proot


def _pull_counting_reads(root, lock, sources):
    """A pull with the real rsync; returns its result and the status reads it made."""
    reads = []

    def rsync(cmd, timeout, **kw):
        if "status-" in cmd[-1]:
            reads.append(cmd[-1])
        return peer.run_rsync(cmd, timeout, **kw)

    return peer.pull(root=root, lock=lock, sources=sources, poll_seconds=0.02, rsync=rsync), reads


def test_a_child_behind_its_parent_reads_the_status_once_for_the_files_the_parent_is_ahead_by(tmp_path):
    """A status read is a round trip (an SSH session and rrsync) before a transfer: a child that lags its parent
    takes every file the last read listed without reading again, so it does not fall further behind per file."""
    oroot, lock = _origin(tmp_path)
    proot = _peer_holding(tmp_path, oroot, lock, "p")
    res, reads = _pull_counting_reads(str(tmp_path / "c"), lock, [_src("p", proot), _src("o", oroot, True)])
    assert len(reads) == 1 and res["sources"] == ["p"] and res["dropped"] == []
    assert _files(str(tmp_path / "c"), lock) == _files(oroot, lock, "final")


def test_a_listed_file_gone_from_the_parent_is_read_again_before_the_parent_is_dropped(tmp_path):
    """A file the last read listed may be gone when it is asked for (the parent restarted and removed it): that
    is no reason to drop the parent until a fresh read still lists a file the parent cannot serve."""
    oroot, lock = _origin(tmp_path)
    gone = lock["files"][2]["name"]
    proot = _peer_holding(tmp_path, oroot, lock, "p", missing=[gone])
    res, reads = _pull_counting_reads(str(tmp_path / "c"), lock, [_src("p", proot), _src("o", oroot, True)])
    assert len(reads) == 2, "read once at the start, once more when the listed file was not there"
    assert [d["host"] for d in res["dropped"]] == ["p"]
    assert f"rsync of {gone} failed (exit {peer.RSYNC_PARTIAL}" in res["dropped"][0]["reason"]
    assert _files(str(tmp_path / "c"), lock) == _files(oroot, lock, "final")


def test_a_flipped_byte_at_the_source_is_caught_and_never_served_onwards(tmp_path):
    oroot, lock = _origin(tmp_path)
    bad_root = str(tmp_path / "bad")
    bad_staging = model_paths(bad_root, REPO, COMMIT)["staging"]
    os.makedirs(os.path.dirname(bad_staging), exist_ok=True)
    import shutil
    shutil.copytree(model_paths(oroot, REPO, COMMIT)["final"], bad_staging)
    victim = lock["files"][2]["name"]
    with open(os.path.join(bad_staging, victim), "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0x01]))
    # the bad peer claims every file verified (what a disk error after verification looks like)
    peer_status = model_paths(bad_root, REPO, COMMIT)["status"]
    os.makedirs(os.path.dirname(peer_status), exist_ok=True)
    json.dump({"state": "receiving", "revision": COMMIT, "verified": [e["name"] for e in lock["files"]],
               "updated_at": 1}, open(peer_status, "w"))
    root = str(tmp_path / "c")
    res = peer.pull(root=root, lock=lock, sources=[_src("bad", bad_root), _src("o", oroot, True)], poll_seconds=0.02)
    assert [d["host"] for d in res["dropped"]] == ["bad"]
    why = res["dropped"][0]["reason"]
    assert f"it served {victim} with sha256" in why and "the copy there is bad" in why
    assert _files(root, lock) == _files(oroot, lock, "final")

    # with the bad peer as the only source: nothing bad is kept, the error names the file and the host
    root2 = str(tmp_path / "d")
    with pytest.raises(peer.PeerError) as e:
        peer.pull(root=root2, lock=lock, sources=[_src("bad", bad_root)], poll_seconds=0.02)
    msg = str(e.value)
    assert f"no source left to pull {victim}" in msg and "bad: it served" in msg and "rerun" in msg
    staging2 = model_paths(root2, REPO, COMMIT)["staging"]
    assert not os.path.exists(os.path.join(staging2, victim))
    st = json.load(open(model_paths(root2, REPO, COMMIT)["status"]))
    assert st["state"] == "failed" and victim not in st["verified"]
    assert not is_complete(model_paths(root2, REPO, COMMIT)["final"], COMMIT)


def test_a_source_that_makes_no_progress_is_left_for_the_next(tmp_path):
    oroot, lock = _origin(tmp_path)
    stuck = str(tmp_path / "stuck")
    st_path = model_paths(stuck, REPO, COMMIT)["status"]
    os.makedirs(os.path.dirname(st_path), exist_ok=True)
    json.dump({"state": "receiving", "revision": COMMIT, "verified": [], "updated_at": 7}, open(st_path, "w"))
    root = str(tmp_path / "e")
    t = time.monotonic()
    res = peer.pull(root=root, lock=lock, sources=[_src("stuck", stuck), _src("o", oroot, True)],
                    poll_seconds=0.05, stall_seconds=0.5)
    assert time.monotonic() - t >= 0.5
    assert res["dropped"] == [{"host": "stuck", "reason": "it made no progress for 0.5 s"}]
    assert res["sources"] == ["o"]


def _closed_port():
    """A loopback port nothing listens on: SSH to it is refused, as to a host whose sshd is down."""
    from modelfleet.harness.servers import reserved_port

    return reserved_port()


def test_a_host_that_refuses_ssh_is_dropped_after_three_reads_in_a_row(tmp_path):
    oroot, lock = _origin(tmp_path)
    gone = {"host": "gone", "address": "127.0.0.1", "port": _closed_port(), "user": "nobody",
            "root": "/models", "complete": False}
    reads = []

    def counting(cmd, timeout, **kw):
        if "status-" in cmd[-1]:
            reads.append(cmd[-1])
        return peer.run_rsync(cmd, timeout, **kw)

    res = peer.pull(root=str(tmp_path / "f"), lock=lock, sources=[gone, _src("o", oroot, True)],
                    poll_seconds=0.05, rsync=counting)
    assert len(reads) == peer.STATUS_TRIES == 3
    assert res["dropped"] == [{"host": "gone", "reason": "its status could not be read 3 times in a row (host "
                                                         "down, or its SSH access refused)"}]
    assert res["sources"] == ["o"]


def test_one_lost_status_read_does_not_drop_a_good_parent(tmp_path):
    """A connection lost once (sshd restarting, a full accept queue) is not a dead host: the next read decides."""
    oroot, lock = _origin(tmp_path)
    aroot = str(tmp_path / "a")
    peer.pull(root=aroot, lock=lock, sources=[_src("o", oroot, True)], poll_seconds=0.02)
    failed = []

    def flaky(cmd, timeout, **kw):
        if "status-" in cmd[-1] and len(failed) < peer.STATUS_TRIES - 1:
            failed.append(cmd[-1])
            return 255, "ssh: connect to host a port 22: Connection reset by peer"
        return peer.run_rsync(cmd, timeout, **kw)

    res = peer.pull(root=str(tmp_path / "b"), lock=lock, sources=[_src("a", aroot), _src("o", oroot, True)],
                    poll_seconds=0.02, rsync=flaky)
    assert len(failed) == 2 and res["dropped"] == [] and res["sources"] == ["a"]


def test_a_parent_moving_one_file_for_longer_than_the_stall_time_is_progress_not_a_stall(tmp_path):
    """A child times its parent's progress by the parent's status. A file that takes the parent longer than the
    stall time to receive (a 9 GB shard at 500 Mbit/s: 150 s, against 120 s by default) left that status unchanged,
    and the child dropped a healthy parent to pull from the origin: on a slow network every child did, and the
    chain became a star. While a file moves, the status is written again each interval in which it grew."""
    oroot, lock = _origin(tmp_path, sizes=(1_200_000, 5))
    aroot, broot = str(tmp_path / "a"), str(tmp_path / "b")
    out = {}

    def slow_link(cmd, timeout, **kw):  # the parent's link: 1.2 MB at 500 KB/s, 2.4 s for its first file
        return peer.run_rsync([cmd[0], "--bwlimit=500", *cmd[1:]], timeout, **kw)

    ta = threading.Thread(target=lambda: out.setdefault("a", peer.pull(
        root=aroot, lock=lock, sources=[_src("o", oroot, True)], poll_seconds=0.1, rsync=slow_link)))
    ta.start()
    t = time.monotonic()
    res_b = peer.pull(root=broot, lock=lock, sources=[_src("a", aroot), _src("o", oroot, True)],
                      poll_seconds=0.05, stall_seconds=1.0)
    ta.join()
    assert time.monotonic() - t > 2.0, "the parent's first file did not take longer than the child's stall time"
    assert res_b["dropped"] == [] and res_b["sources"] == ["a"], res_b["dropped"]
    assert _files(broot, lock) == _files(oroot, lock, "final")

    # and a transfer that moves nothing is still no progress: the parent is dropped after the stall time
    croot = str(tmp_path / "c")

    hung = []

    def hung_link(cmd, timeout, **kw):  # its first session: connected (the first file is there), nothing moves for 3 s
        if not hung and _batch(cmd):
            hung.append(open(os.path.join(cmd[-1], _batch(cmd)[0]), "ab").close())
            time.sleep(3.0)
        return peer.run_rsync(cmd, timeout, **kw)

    tc = threading.Thread(target=lambda: out.setdefault("c", peer.pull(
        root=croot, lock=lock, sources=[_src("o", oroot, True)], poll_seconds=0.1, rsync=hung_link)))
    tc.start()
    res_d = peer.pull(root=str(tmp_path / "d"), lock=lock, sources=[_src("c", croot), _src("o", oroot, True)],
                      poll_seconds=0.05, stall_seconds=1.0)
    tc.join()
    assert res_d["dropped"] == [{"host": "c", "reason": "it made no progress for 1 s"}] and res_d["sources"] == ["o"]


def test_a_status_rewritten_within_the_second_it_was_read_is_read_anew(tmp_path):
    """rsync's quick check skips a file of the same size and the same second: a parent's status rewritten with the
    same length in the second the child last read it (one heartbeat after another) read as unchanged, and the
    child took a moving parent for a stalled one."""
    aroot = str(tmp_path / "a")
    st_path = model_paths(aroot, REPO, COMMIT)["status"]
    os.makedirs(os.path.dirname(st_path))
    rel = os.path.relpath(st_path, aroot)
    scratch = str(tmp_path / "scratch")
    os.makedirs(scratch)
    second = 1_800_000_000 * 10**9
    for i, at_ns in enumerate((second + 100_000_000, second + 400_000_000)):
        with open(st_path, "w") as f:
            json.dump({"state": "receiving", "revision": COMMIT, "verified": [], "updated_at": 1000 + i}, f)
        os.utime(st_path, ns=(at_ns, at_ns))
        got = peer._source_status(_src("a", aroot), rel, scratch, peer.run_rsync, 10)
        assert got["updated_at"] == 1000 + i, "the status read returned the one before"


def test_a_child_that_starts_before_its_parent_waits_for_it(tmp_path):
    """Every host of a chain starts its pull in the same task: a child can ask for its parent's status before the
    parent's pull has written any. Seen in molecule/fleet (fleet-3 dropped fleet-2 and took tiny-llama-b from the
    origin). The parent answers, so it is waited for, under the same stall limit as a parent that stops."""
    oroot, lock = _origin(tmp_path)
    aroot, broot = str(tmp_path / "a"), str(tmp_path / "b")
    out = {}

    def parent():
        time.sleep(0.6)
        out["a"] = peer.pull(root=aroot, lock=lock, sources=[_src("o", oroot, True)], poll_seconds=0.02)

    ta = threading.Thread(target=parent)
    ta.start()
    res_b = peer.pull(root=broot, lock=lock, sources=[_src("a", aroot), _src("o", oroot, True)],
                      poll_seconds=0.02, stall_seconds=5)
    ta.join()
    assert res_b["dropped"] == [] and res_b["sources"] == ["a"]
    assert _files(broot, lock) == _files(oroot, lock, "final")
    # a parent that never starts is dropped once the stall limit passes, saying so
    t = time.monotonic()
    res_c = peer.pull(root=str(tmp_path / "c"), lock=lock,
                      sources=[_src("never", str(tmp_path / "nowhere")), _src("o", oroot, True)],
                      poll_seconds=0.05, stall_seconds=0.5)
    assert time.monotonic() - t >= 0.5
    assert res_c["dropped"] == [{"host": "never",
                                 "reason": "its own pull had not started after 0.5 s (no status there)"}]
    assert res_c["sources"] == ["o"]


def test_a_killed_pull_resumes_keeping_verified_files_and_a_partial_one(tmp_path):
    oroot, lock = _origin(tmp_path)
    root = str(tmp_path / "g")
    first, big = lock["files"][1], lock["files"][0]
    staging = model_paths(root, REPO, COMMIT)["staging"]
    os.makedirs(os.path.join(staging, ".cache", "peer", "files"), exist_ok=True)
    ofinal = model_paths(oroot, REPO, COMMIT)["final"]
    # a verified file (no record: hashed again and kept), a corrupt one (removed), half of the big one in flight
    open(os.path.join(staging, first["name"]), "wb").write(open(os.path.join(ofinal, first["name"]), "rb").read())
    third = lock["files"][3]
    open(os.path.join(staging, third["name"]), "wb").write(b"\x00" * third["size"] if third["size"] else b"")
    data = open(os.path.join(ofinal, big["name"]), "rb").read()
    open(os.path.join(staging, ".cache", "peer", "files", big["name"]), "wb").write(data[: len(data) // 2])
    moved = []

    def rsync(cmd, timeout, **kw):
        moved.append(_batch(cmd))
        return peer.run_rsync(cmd, timeout, **kw)

    res = peer.pull(root=root, lock=lock, sources=[_src("o", oroot, True)], rsync=rsync)
    assert moved[0] == [big["name"]], "the half-moved file is continued on its own (--append-verify)"
    assert first["name"] not in sum(moved, []), "a verified file was fetched again"
    assert res["kept"] == 1 and res["bytes_moved"] == lock["total_bytes"] - first["size"]
    assert _files(root, lock) == _files(oroot, lock, "final")


def _writers(path):
    """PIDs of the processes whose command line names `path`."""
    out = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and path in open(f"/proc/{d}/cmdline", "rb").read().decode(errors="replace"):
                out.append(int(d))
        except OSError:
            pass
    return out


def test_a_killed_pull_leaves_no_rsync_writing_behind_it(tmp_path):
    """SIGKILL to the pull (the out-of-memory killer, `pkill -9`) ends its rsync too. A session left running would go
    on writing its run of files into scratch while the rerun moves the same files: two writers on one file."""
    oroot, lock = _origin(tmp_path, sizes=(400_000, 5, 400_000, 1))
    json.dump(lock, open(tmp_path / "lock.json", "w"))
    script = tmp_path / "pull.py"
    script.write_text(
        "import json, sys\n"
        "from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import peer\n"
        "def slow(cmd, timeout, **kw):\n"
        "    return peer.run_rsync([cmd[0], '--bwlimit=50', *cmd[1:]], timeout, **kw)\n"
        "peer.pull(root=sys.argv[2], lock=json.load(open(sys.argv[1])), rsync=slow,\n"
        "          sources=[{'host': 'o', 'address': '', 'root': sys.argv[3], 'complete': True}])\n")
    root = str(tmp_path / "a")
    files_dir = os.path.join(model_paths(root, REPO, COMMIT)["staging"], ".cache", "peer", "files")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "lock.json"), root, oroot])
    try:
        t = time.monotonic()
        moving = [os.path.join(files_dir, e["name"]) for e in lock["files"]]
        while time.monotonic() - t < 30 and not any(os.path.isfile(m) and os.path.getsize(m) for m in moving):
            time.sleep(0.05)
        assert _writers(files_dir), "the pull's rsync was not moving"
        proc.kill()
        proc.wait()
        t = time.monotonic()
        while _writers(files_dir) and time.monotonic() - t < 5:
            time.sleep(0.05)
        left = _writers(files_dir)
        assert not left, "an rsync went on writing after its pull was killed"
    finally:
        proc.kill()
        for pid in _writers(files_dir):
            os.kill(pid, 9)


def test_finalize_refuses_a_file_changed_after_it_was_verified(tmp_path):
    oroot, lock = _origin(tmp_path)
    root = str(tmp_path / "h")
    peer.pull(root=root, lock=lock, sources=[_src("o", oroot, True)])
    p = os.path.join(model_paths(root, REPO, COMMIT)["staging"], lock["files"][0]["name"])
    with open(p, "r+b") as f:
        f.write(b"X")
    os.utime(p, ns=(1, 1))
    with pytest.raises(peer.PeerError, match="nothing was marked complete"):
        peer.finalize_recorded(root=root, lock=lock)
    assert not is_complete(model_paths(root, REPO, COMMIT)["final"], COMMIT)
