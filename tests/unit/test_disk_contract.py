"""The disk plan's whole output, exactly, for hand-worked cases - every field the roles, the CLI and the
report read (what each deletion carries, the figures, the reasons, the messages) - and the measuring
helpers' fields on a real tree. test_disk_plan.py holds the properties (nothing outside the root, no guard
crossed, minimal deletions); this file pins the contract a change could otherwise break silently (the
mutation run of scripts/mutation.sh found these fields unchecked)."""

from __future__ import annotations

import os

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import disk
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.disk import (
    COMPLETE,
    LAST_USED,
    MARKER_DIR,
    dir_usage,
    list_model_dirs,
    measure_fs,
    plan_disk,
    plan_host,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import GB, both_units


def cand(name, gb, last_used, **kw):
    d = {"path": f"/m/{name}", "resolved": f"/m/{name}", "allocated_bytes": gb * GB + 7,
         "exclusive_allocated_bytes": gb * GB, "last_used": last_used, "model": True, "symlink": False,
         "complete": True, "dev": 1, "ino": int(last_used * 10)}
    d.update(kw)
    return d


def deleted(c, explicit=False):
    return {"path": c["path"], "bytes": c["exclusive_allocated_bytes"], "explicit": explicit,
            "last_used": c["last_used"], "complete": c["complete"], "dev": c["dev"], "ino": c["ino"]}


def figures(**kv):
    return {k: both_units(v) for k, v in kv.items()}


NOT_A_MODEL = ("not a model, never deleted (no modelfleet marker, no config.json with weight files, no hub-cache "
               "snapshot)")
SAME = lambda p: p  # noqa: E731 - realpath of a tree without links


def test_a_feasible_plan_exactly():
    old, notmodel, link = cand("old", 100, 1.0), cand("notmodel", 500, 0.5, model=False), \
        cand("link", 300, 0.7, symlink=True, resolved="/etc")
    used, fallback, mid = cand("used", 200, 2.0), cand("fallback", 150, 3.0), cand("mid", 50, 4.0, complete=False)
    named, newest = cand("named", 80, 9.0), cand("newest", 400, 10.0)
    p = plan_disk(root="/m", free_bytes=300 * GB, total_bytes=2000 * GB, required_bytes=600 * GB,
                  candidates=[old, notmodel, link, used, fallback, mid, named, newest], headroom_bytes=10 * GB,
                  headroom_percent=1.0, explicit=("/m/named", "/m/absent", "/m/named"), in_use=("/m/used",),
                  present_bytes=20 * GB, keep_until_verified=("/m/fallback",), realpath=SAME)
    # headroom: the larger of 10 GB and 1 % of 2,000 GB; need = 600 + 20 - 20 present; shortfall = 600 - 300.
    # Order: the named model first (named twice, listed once), then the least recently used; refused ones
    # skipped with their reason, the fallback kept (others cover the need), stop once 300 GB are covered.
    assert p == {
        "root": "/m", "free_bytes": 300 * GB, "total_bytes": 2000 * GB, "required_bytes": 600 * GB,
        "present_bytes": 20 * GB, "headroom_bytes": 20 * GB, "need_bytes": 600 * GB, "shortfall_bytes": 300 * GB,
        "delete": [deleted(named, True), deleted(old), deleted(mid), deleted(newest)],
        "would_delete_if_feasible": [], "delete_bytes": 630 * GB, "delete_after_verify": [],
        "refused": [{"path": "/m/absent", "reason": "not a model directory under the root"},
                    {"path": "/m/notmodel", "reason": NOT_A_MODEL},
                    {"path": "/m/link", "reason": "a symlink (only real directories are deleted)"},
                    {"path": "/m/used", "reason": "in use by a live unit or a running process"}],
        "feasible": True, "free_after_delete_bytes": 930 * GB, "free_after_fetch_bytes": 350 * GB,
        "free_after_verify_cleanup_bytes": 350 * GB,
        "figures": figures(free=300 * GB, required=600 * GB, headroom=20 * GB, shortfall=300 * GB,
                           free_after_delete=930 * GB, free_after_fetch=350 * GB, free_after_verify_cleanup=350 * GB),
        "summary": "free 300.00 GB (279.40 GiB); need 600.00 GB (558.79 GiB) (required 600.00 GB (558.79 GiB) + "
                   "headroom 20.00 GB (18.63 GiB) - present 20.00 GB (18.63 GiB)); shortfall 300.00 GB (279.40 GiB)",
        "message": "delete 4 model dir(s) freeing 630.00 GB (586.73 GiB) to cover a shortfall of 300.00 GB "
                   "(279.40 GiB); free after: 930.00 GB (866.13 GiB)",
    }


def test_an_infeasible_plan_exactly():
    a, b = cand("a", 100, 1.0), cand("b", 50, 2.0)
    outside = cand("out", 900, 0.1, resolved="/elsewhere/out")
    rootself = cand("dot", 900, 0.2, resolved="/m")
    prot, dep = cand("prot", 900, 0.3), cand("dep", 900, 0.4)
    p = plan_disk(root="/m", free_bytes=10 * GB, total_bytes=1000 * GB, required_bytes=500 * GB,
                  candidates=[a, b, outside, rootself, prot, dep], headroom_percent=10.0, protected=("/m/prot",),
                  deploying=("/m/dep",), present_bytes=-5, realpath=SAME)
    # headroom 10 % of 1,000 GB; a negative present counts as none; the 150 GB allowed do not cover 590 GB
    assert p == {
        "root": "/m", "free_bytes": 10 * GB, "total_bytes": 1000 * GB, "required_bytes": 500 * GB,
        "present_bytes": -5, "headroom_bytes": 100 * GB, "need_bytes": 600 * GB, "shortfall_bytes": 590 * GB,
        "delete": [], "would_delete_if_feasible": [deleted(a), deleted(b)], "delete_bytes": 0,
        "delete_after_verify": [],
        "refused": [{"path": "/m/out", "reason": "outside the models root (resolves to /elsewhere/out)"},
                    {"path": "/m/dot", "reason": "the models root itself"},
                    {"path": "/m/prot", "reason": "protected"},
                    {"path": "/m/dep", "reason": "the model being deployed"}],
        "feasible": False, "free_after_delete_bytes": 10 * GB, "free_after_fetch_bytes": None,
        "free_after_verify_cleanup_bytes": None,
        "figures": figures(free=10 * GB, required=500 * GB, headroom=100 * GB, shortfall=590 * GB,
                           free_after_delete=10 * GB),
        "summary": "free 10.00 GB (9.31 GiB); need 600.00 GB (558.79 GiB) (required 500.00 GB (465.66 GiB) + "
                   "headroom 100.00 GB (93.13 GiB) - present 0 B); shortfall 590.00 GB (549.48 GiB)",
        "message": "cannot make room: need 600.00 GB (558.79 GiB) (required 500.00 GB (465.66 GiB) + headroom "
                   "100.00 GB (93.13 GiB) - present -5 B), free 10.00 GB (9.31 GiB), and every allowed deletion "
                   "together frees only 150.00 GB (139.70 GiB); 4 candidate(s) refused (see 'refused')",
    }


def test_no_deletion_needed_and_named_ones_deferred_exactly():
    a, b = cand("a", 100, 1.0), cand("b", 50, 2.0, exclusive_allocated_bytes=None)
    del b["exclusive_allocated_bytes"]  # an entry measured without hard-link accounting: its allocated bytes
    p = plan_disk(root="/m/", free_bytes=800 * GB, total_bytes=1000 * GB, required_bytes=500 * GB,
                  candidates=[a, b], explicit=("/m/b",), realpath=SAME)
    later = [{"path": "/m/b", "bytes": 50 * GB + 7, "dev": 1, "ino": 20}]
    assert p["delete"] == [] and p["delete_after_verify"] == later and p["feasible"] is True
    assert (p["need_bytes"], p["shortfall_bytes"], p["free_after_delete_bytes"], p["free_after_fetch_bytes"],
            p["free_after_verify_cleanup_bytes"]) == (500 * GB, 0, 800 * GB, 300 * GB, 350 * GB + 7)
    assert p["message"] == ("no deletion needed: free 800.00 GB (745.06 GiB) covers need 500.00 GB (465.66 GiB); "
                            "1 explicit deletion(s) deferred until the new model is verified")
    # not deferred: nothing after verify, and the message says only the first part
    q = plan_disk(root="/m", free_bytes=800 * GB, total_bytes=1000 * GB, required_bytes=500 * GB,
                  candidates=[a, b], explicit=("/m/b",), defer_explicit=False, realpath=SAME)
    assert q["delete_after_verify"] == [] and q["free_after_verify_cleanup_bytes"] == 300 * GB
    assert q["message"] == "no deletion needed: free 800.00 GB (745.06 GiB) covers need 500.00 GB (465.66 GiB)"
    # named by its resolved spelling: the same entry, once
    r = plan_disk(root="/m", free_bytes=0, total_bytes=1000 * GB, required_bytes=60 * GB,
                  candidates=[a, dict(b, path="/m/link-to-b", resolved="/m/b")], explicit=("/m/b",),
                  realpath=lambda p: {"/m/b": "/m/b"}.get(p, p))
    assert [d["path"] for d in r["delete"]] == ["/m/link-to-b", "/m/a"] and r["delete"][0]["explicit"] is True


def test_an_exact_fit_deletes_no_more():
    a, b = cand("a", 100, 1.0), cand("b", 100, 2.0)
    p = plan_disk(root="/m", free_bytes=0, total_bytes=1000 * GB, required_bytes=100 * GB, candidates=[a, b],
                  realpath=SAME)
    assert [d["path"] for d in p["delete"]] == ["/m/a"] and p["free_after_fetch_bytes"] == 0
    # equal last use: the path decides, so the order never depends on the listing's order
    c = cand("c", 100, 1.0)
    assert [d["path"] for d in plan_disk(root="/m", free_bytes=0, total_bytes=1000 * GB, required_bytes=GB,
                                         candidates=[c, a], realpath=SAME)["delete"]] == ["/m/a"]


def _model(path, weights=b"w" * 5000):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write("{}")
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(weights)


def test_listed_entries_carry_every_field(tmp_path):
    root = tmp_path / "m"
    rev = "a" * 40
    m = root / "org--name" / rev
    _model(str(m))
    os.makedirs(m / MARKER_DIR)
    (m / MARKER_DIR / COMPLETE).write_text("")
    os.utime(m / MARKER_DIR / COMPLETE, (1000, 1000))
    (root / "notes").mkdir()
    os.symlink("/etc", root / "escape")
    (root / "plain-file").write_text("x")
    (root / ".staging").mkdir()
    entries = {os.path.relpath(e["path"], root): e for e in list_model_dirs(str(root))}
    assert sorted(entries) == ["escape", "notes", f"org--name/{rev}"]
    e = entries[f"org--name/{rev}"]
    st = os.lstat(m)
    assert e == {"path": str(m), "resolved": str(m), "symlink": False, "model": True, "evidence": e["evidence"],
                 "last_used": 1000.0, "complete": True, **dir_usage(str(m)), "dev": st.st_dev, "ino": st.st_ino}
    assert e["evidence"]
    st = os.lstat(root / "escape")
    assert entries["escape"] == {"path": str(root / "escape"), "resolved": "/etc", "symlink": True, "model": False,
                                 "evidence": None, "allocated_bytes": 0, "apparent_bytes": 0,
                                 "exclusive_allocated_bytes": 0, "last_used": 0.0, "dev": st.st_dev, "ino": st.st_ino}
    assert entries["notes"]["model"] is False and entries["notes"]["symlink"] is False
    # last use: the last-used marker first, then the completion marker, then the folder itself
    (m / MARKER_DIR / LAST_USED).write_text("")
    os.utime(m / MARKER_DIR / LAST_USED, (2000, 2000))
    assert disk._last_used(str(m)) == 2000.0
    os.remove(m / MARKER_DIR / LAST_USED)
    os.remove(m / MARKER_DIR / COMPLETE)
    os.utime(m, (3000, 3000))
    assert disk._last_used(str(m)) == 3000.0
    assert disk._last_used(str(root / "gone")) == 0.0
    e = {os.path.relpath(x["path"], root): x for x in list_model_dirs(str(root))}[f"org--name/{rev}"]
    assert e["complete"] is False


def test_dir_usage_counts_each_inode_once_and_only_exclusive_blocks(tmp_path):
    t = tmp_path / "t"
    t.mkdir()
    (t / "a").write_bytes(b"x" * 10000)
    os.link(t / "a", t / "a2")          # a hard link inside the tree: still exclusive
    (t / "b").write_bytes(b"y" * 20000)
    os.link(t / "b", tmp_path / "b-out")  # linked from outside: deleting the tree frees nothing of it
    (t / "sub").mkdir()
    os.symlink("/etc/hostname", t / "sub" / "l")
    u = dir_usage(str(t))
    blocks = {n: os.lstat(t / n).st_blocks * 512 for n in ("a", "b", "sub")}
    link_blocks = os.lstat(t / "sub" / "l").st_blocks * 512
    top = os.lstat(t).st_blocks * 512
    assert u["apparent_bytes"] == 10000 + 20000 + os.lstat(t / "sub").st_size + os.lstat(t / "sub" / "l").st_size
    assert u["allocated_bytes"] == blocks["a"] + blocks["b"] + blocks["sub"] + link_blocks + top
    # b's blocks stay held by its other name; folders (never hard-linked) and the top count
    assert u["exclusive_allocated_bytes"] == blocks["a"] + blocks["sub"] + link_blocks + top
    assert dir_usage(str(tmp_path / "missing")) == {"apparent_bytes": 0, "allocated_bytes": 0,
                                                    "exclusive_allocated_bytes": 0}


def test_measure_fs_fields_on_a_real_filesystem(tmp_path):
    st = os.statvfs(tmp_path)
    fs = measure_fs(str(tmp_path))
    assert fs == {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": fs["free_bytes"],
                  "free_root_bytes": fs["free_root_bytes"], "reserved_bytes": fs["free_root_bytes"] - fs["free_bytes"],
                  "block_size": st.f_frsize, "source": "statvfs f_bavail"}
    assert abs(fs["free_bytes"] - st.f_bavail * st.f_frsize) < 64 << 20


ZFS_MOUNTS = ("rpool/ROOT / zfs rw 0 0\n"
              "short line\n"
              "tank/models /models zfs rw,xattr,noacl 0 0\n"
              "tank/models/big /models/big zfs rw,xattr,noacl 0 0\n"
              "tank /tank zfs rw 0 0\n"
              "tank/sp /sp\\040ace zfs rw 0 0\n"
              "/dev/sda1 /models-ext4 ext4 rw 0 0\n"
              "tank/x /dataX zfs rw 0 0\n"
              "/dev/sdc1 /models/ext ext4 rw 0 0\n"
              "tank/old /stacked zfs rw 0 0\n"
              "tank/new /stacked zfs rw 0 0\n")


@pytest.mark.parametrize("path,dataset", [
    ("/models", "tank/models"), ("/models/a/b", "tank/models"), ("/models/big/x", "tank/models/big"),
    ("/models/bigger", "tank/models"), ("/models-ext4/a", None), ("/tankx", "rpool/ROOT"), ("/tank", "tank"),
    ("/dataX/m", "tank/x"), ("/stacked/m", "tank/new"), ("/models/ext/a", None), ("/models/extra", "tank/models"),
    ("/sp ace/x", "tank/sp"),
])
def test_zfs_dataset_is_the_longest_zfs_mount_holding_the_path(tmp_path, path, dataset):
    mounts = tmp_path / "mounts"
    mounts.write_text(ZFS_MOUNTS)
    assert disk._zfs_dataset(path, mounts=str(mounts), which={"zfs": "/sbin/zfs"}.get) == dataset
    assert disk._zfs_dataset(path, mounts=str(mounts), which=lambda _: None) is None
    assert disk._zfs_dataset(path, mounts=str(tmp_path / "absent"), which=lambda _: "/sbin/zfs") is None


def test_measure_fs_takes_the_zfs_datasets_available_space(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(f"pool/ds {tmp_path} zfs rw 0 0\n")
    calls = []

    def zfs(argv, **kw):
        calls.append(argv)
        assert kw == {"capture_output": True, "text": True, "check": False}
        # `zfs get -Hp -o value available,used DATASET` prints one value per line
        return type("R", (), {"returncode": 0, "stdout": "1000\n250\n", "stderr": ""})()

    fs = measure_fs(str(tmp_path), run=zfs, mounts=str(mounts), which=lambda _: "/sbin/zfs")
    assert calls == [["zfs", "get", "-Hp", "-o", "value", "available,used", "pool/ds"]]
    assert (fs["free_bytes"], fs["total_bytes"], fs["source"]) == (1000, 1250, "zfs dataset pool/ds 'available'")

    def failing(argv, **kw):
        return type("R", (), {"returncode": 1, "stdout": "", "stderr": "no such dataset"})()

    fs = measure_fs(str(tmp_path), run=failing, mounts=str(mounts), which=lambda _: "/sbin/zfs")
    assert fs["source"] == "statvfs f_bavail"


def test_plan_host_reports_what_it_saw(tmp_path):
    root = tmp_path / "m"
    _model(str(root / "org--a" / ("a" * 40)))
    _model(str(root / "org--b" / ("b" * 40)))
    (root / "datasets").mkdir()
    staging = root / ".staging" / "new"
    staging.mkdir(parents=True)
    (staging / "part").write_bytes(b"z" * 40000)
    proc = tmp_path / "proc"
    proc.mkdir()  # no process on this host
    p = plan_host(root=str(root) + "/", required_bytes=30000, explicit=(str(root / "org--a" / ("a" * 40)),),
                  deploying=(str(staging),), read_units=False, proc=str(proc))
    assert p["root"] == str(root) and p["units_read"] is False and p["in_use"] == []
    assert p["not_models"] == [str(root / "datasets")]
    assert p["candidates"] == [str(root / "datasets"), str(root / "org--a" / ("a" * 40)),
                               str(root / "org--b" / ("b" * 40))]
    # the staging's blocks count as present, at most the model's size
    assert p["present_measured_bytes"] == 30000 == p["present_bytes"]
    assert p["fallback_deleted_early"] == [] and p["filesystem"]["source"] == "statvfs f_bavail"
    assert p["delete_after_verify"][0]["path"] == str(root / "org--a" / ("a" * 40))


def test_plan_edges_zero_need_and_defaults():
    # nothing required, nothing free: feasible, nothing deleted
    p = plan_disk(root="/m", free_bytes=0, total_bytes=1, required_bytes=0, candidates=[cand("a", 1, 1.0)],
                  realpath=SAME)
    assert (p["need_bytes"], p["shortfall_bytes"], p["feasible"], p["delete"]) == (0, 0, True, [])
    # the whole model already present: nothing to write
    p = plan_disk(root="/m", free_bytes=0, total_bytes=1, required_bytes=100, present_bytes=100, candidates=[],
                  realpath=SAME)
    assert (p["need_bytes"], p["free_after_fetch_bytes"]) == (0, 0)
    # a candidate with no last use recorded counts as the oldest; one without an exclusive figure frees its
    # allocated bytes
    a, b = cand("a", 10, 5.0), cand("b", 10, 6.0)
    del a["last_used"], b["exclusive_allocated_bytes"]
    p = plan_disk(root="/m", free_bytes=0, total_bytes=1, required_bytes=1, candidates=[b, a], realpath=SAME)
    assert [d["path"] for d in p["delete"]] == ["/m/a"] and p["delete"][0]["last_used"] is None
    p = plan_disk(root="/m", free_bytes=0, total_bytes=1, required_bytes=11 * GB, candidates=[b, a], realpath=SAME)
    assert [d["bytes"] for d in p["delete"]] == [10 * GB, 10 * GB + 7]


def test_plan_uses_the_given_realpath_everywhere():
    links = {"/m/alias": "/m/fallback", "/m/p": "/elsewhere/p"}
    rp = lambda p: links.get(p, p)  # noqa: E731
    fb, other = cand("fallback", 10, 1.0, resolved=None), cand("other", 10, 2.0)
    # the fallback named by another spelling is still the fallback (kept while others cover the need)
    p = plan_disk(root="/m", free_bytes=0, total_bytes=1, required_bytes=GB, candidates=[fb, other],
                  keep_until_verified=("/m/alias",), realpath=rp)
    assert [d["path"] for d in p["delete"]] == ["/m/other"]
    # a protected path that resolves outside the root is refused by the same realpath
    with pytest.raises(disk.DiskPlanError) as e:
        plan_disk(root="/m", free_bytes=0, total_bytes=1, required_bytes=1, candidates=[], protected=("/m/p",),
                  realpath=rp)
    assert str(e.value) == ("protected path /m/p is outside the models root /m; protect paths under the root only "
                            "(outside it nothing is ever deleted anyway)")
    # named by a spelling that resolves to a listed candidate: that candidate
    p = plan_disk(root="/m", free_bytes=0, total_bytes=1, required_bytes=1, candidates=[cand("fallback", 1, 1.0)],
                  explicit=("/m/alias",), realpath=rp)
    assert p["delete"][0]["path"] == "/m/fallback" and p["delete"][0]["explicit"] is True


# Names that end in "X" or "/" and blanks inside names: the path rules must treat every character alike
# (the mutation run's strip and split mutants showed no test had such names).
@pytest.mark.parametrize("child,parent,inside", [
    ("/modelsX/a", "/modelsX", True), ("/modelsX", "/modelsX/", True), ("/modelsX/", "/modelsX", True),
    ("/models/a", "/models/", True), ("/modelsXa", "/modelsX", False), ("/a b/c", "/a b", True),
    ("/x", "/", True), ("/x", "//", True), ("/", "/x", False),
])
def test_inside_with_awkward_names(child, parent, inside):
    assert disk._inside(child, parent) is inside


def test_checked_root_spellings():
    assert disk.check_models_root("/modelsX", resolve=False) == "/modelsX"
    assert disk.check_models_root("//X/models", resolve=False) == "/X/models"
    assert disk.check_models_root("/models X/", resolve=False) == "/models X"


def test_open_dir_nofollow_refuses_a_linked_component_at_any_level(tmp_path):
    (tmp_path / "real X" / "sub").mkdir(parents=True)
    os.symlink(tmp_path / "real X", tmp_path / "link")
    fd = disk._open_dir_nofollow(str(tmp_path / "real X" / "sub"))
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "real X" / "sub"))
    finally:
        os.close(fd)
    for p in (tmp_path / "link" / "sub", tmp_path / "link"):
        with pytest.raises(OSError):
            disk._open_dir_nofollow(str(p))


def test_dir_usage_does_not_follow_links_and_counts_links_outside(tmp_path):
    t = tmp_path / "t"
    t.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"b" * 100000)
    os.symlink(outside, t / "dirlink")  # a linked folder: not walked
    (t / "f").write_bytes(b"f" * 10000)
    os.link(t / "f", t / "f2")
    os.link(t / "f", outside / "f3")  # three names, one outside: deleting the tree frees none of f's blocks
    u = dir_usage(str(t))
    assert u["apparent_bytes"] == 10000 + os.lstat(t / "dirlink").st_size
    fblocks = os.lstat(t / "f").st_blocks * 512
    assert u["exclusive_allocated_bytes"] == u["allocated_bytes"] - fblocks


def test_listing_layouts(tmp_path):
    root = tmp_path / "m"
    hexa, hexb = "a" * 40, "b" * 40
    _model(str(root / "plain" / hexa))          # a folder without "--": one entry, whatever is inside
    _model(str(root / "models--org--x" / hexa))  # a hub-cache name: one entry, not its hex folders
    _model(str(root / "org--y" / hexa))
    (root / "org--y" / hexb).write_text("a file named like a revision")
    os.symlink(root / "org--y" / hexa, root / "org--y" / ("c" * 40))  # a revision-named link: not listed
    listed = [os.path.relpath(e["path"], root) for e in list_model_dirs(str(root))]
    assert listed == ["models--org--x", "org--y/" + hexa, "plain"]
    # an org folder with no revision folder is listed as itself
    (root / "org--z").mkdir()
    assert "org--z" in [os.path.relpath(e["path"], root) for e in list_model_dirs(str(root))]


def test_host_lock_names_its_holder_and_releases(tmp_path):
    """The storage lock across processes (flock is per open file description, so the second taker is a
    child process, as a second run would be)."""
    import subprocess
    import sys

    lock = str(tmp_path / "storage.lock")
    probe = ("import sys\n"
             "from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.disk import HostLock\n"
             "from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import DiskPlanError\n"
             "try:\n    HostLock(sys.argv[1], 'second', float(sys.argv[2])).__enter__()\n    print('TOOK')\n"
             "except DiskPlanError as e:\n    print(e)\n")

    def second(wait=0.0):
        return subprocess.run([sys.executable, "-c", probe, lock, str(wait)], capture_output=True, text=True,
                              check=True).stdout.strip()

    with disk.HostLock(lock) as held:  # no owner named: the pid alone
        with open(lock) as f:
            assert f.read() == f"pid={os.getpid()} "
    with disk.HostLock(lock, "first run") as held:
        assert held.fd is not None
        with open(lock) as f:
            assert f.read() == f"pid={os.getpid()} first run"
        assert second() == (f"another modelfleet run holds the storage lock {lock} (pid={os.getpid()} first run); "
                            "wait for it to finish")
        assert second(0.3).startswith("another modelfleet run holds the storage lock")
    assert held.fd is None and disk.HostLock(lock).fd is None
    with open(lock) as f:
        assert f.read() == ""  # the holder text is cleared on release
    assert second() == "TOOK"


def test_purge_trash_finishes_interrupted_deletions_only(tmp_path):
    root = tmp_path / "m"
    (root / ".trash-1" / "sub").mkdir(parents=True)
    (root / ".trash-1" / "sub" / "w").write_bytes(b"w")
    (root / ".trash-2").mkdir()
    (root / ".trash-file").write_text("a file, not a deletion")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root / ".trash-link")
    (root / "org--a").mkdir()
    assert sorted(disk.purge_trash(str(root))) == [".trash-1", ".trash-2"]
    assert sorted(os.listdir(root)) == [".trash-file", ".trash-link", "org--a"]
    assert (tmp_path / "elsewhere").is_dir()
    assert disk.purge_trash(str(root)) == []


def test_plan_reads_each_candidates_own_fields():
    # later deletions carry the exclusive figure; a candidate with no byte figure at all frees nothing
    a, bare = cand("a", 100, 1.0), {"path": "/m/bare", "resolved": "/m/bare", "model": True, "last_used": 0.5}
    p = plan_disk(root="/m", free_bytes=800 * GB, total_bytes=1000 * GB, required_bytes=1, candidates=[a, bare],
                  explicit=("/m/a", "/m/bare"), realpath=SAME)
    assert [(x["path"], x["bytes"]) for x in p["delete_after_verify"]] == [("/m/a", 100 * GB), ("/m/bare", 0)]
    p = plan_disk(root="/m", free_bytes=0, total_bytes=1, required_bytes=1, candidates=[bare, a], realpath=SAME)
    assert [(x["path"], x["bytes"]) for x in p["delete"]] == [("/m/bare", 0), ("/m/a", 100 * GB)]  # bare frees 0
    # the candidate's recorded resolution is trusted over a fresh realpath: a kept fallback listed by a link
    fb = cand("fb-link", 10, 1.0, resolved="/m/fallback")
    p = plan_disk(root="/m", free_bytes=0, total_bytes=1, required_bytes=1, candidates=[fb, cand("other", 10, 2.0)],
                  keep_until_verified=("/m/fallback",), realpath=SAME)
    assert [d["path"] for d in p["delete"]] == ["/m/other"]
    # a named path is the listed entry of that path, whatever it resolves to
    p = plan_disk(root="/m", free_bytes=0, total_bytes=1, required_bytes=1,
                  candidates=[cand("x", 1, 1.0, resolved="/m/real-x")], explicit=("/m/x",), realpath=SAME)
    assert p["refused"] == [] and p["delete"][0]["path"] == "/m/x"
    # no last use recorded sorts before any recorded one
    early, unknown = cand("early", 10, 0.5), cand("unknown", 10, 9.0)
    del unknown["last_used"]
    p = plan_disk(root="/m", free_bytes=0, total_bytes=1, required_bytes=1, candidates=[early, unknown],
                  realpath=SAME)
    assert [d["path"] for d in p["delete"]] == ["/m/unknown"]


def test_plan_host_passes_every_setting(tmp_path):
    root = tmp_path / "m"
    _model(str(root / "org--a" / ("a" * 40)))
    _model(str(root / "org--b" / ("b" * 40)))
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "cmdline").write_bytes(f"vllm\0serve\0{root}/org--b/{'b' * 40}\0".encode())
    model, used = str(root / "org--a" / ("a" * 40)), str(root / "org--b" / ("b" * 40))
    p = plan_host(root=str(root), required_bytes=10, headroom_percent=0.0001, explicit=(model,), defer_explicit=False,
                  read_units=False, proc=str(proc))
    assert p["shortfall_bytes"] == 0 and p["delete"] == []
    assert p["headroom_bytes"] == int(p["total_bytes"] * 0.0001 / 100) > 0 and p["delete_after_verify"] == []
    assert p["in_use"] == [{"path": used, "kind": "process", "name": "pid 77 ()"}]
    # deferred by default: the named model waits for the new one to be verified
    q = plan_host(root=str(root), required_bytes=10, explicit=(model,), read_units=False, proc=str(proc))
    assert [x["path"] for x in q["delete_after_verify"]] == [model]
    assert q["headroom_bytes"] == 0  # none unless asked for
    with pytest.raises(disk.DiskPlanError) as e:
        plan_host(root=str(root), required_bytes=None, deploying=(str(root / "org--a"),), read_units=False,
                  proc=str(proc))
    assert str(e.value) == "required bytes must be an integer number of bytes, got None"


def test_an_entry_that_vanished_is_listed_without_identity(tmp_path):
    e = disk._entry(str(tmp_path / "gone"), None)
    assert "dev" not in e and "ino" not in e and e["model"] is False


def test_host_lock_waits_for_a_holder_that_finishes(tmp_path):
    import subprocess
    import sys

    lock = str(tmp_path / "storage.lock")
    hold = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, b'pid=1 holder')\nprint('held', flush=True)\n"
            "time.sleep(float(sys.argv[2]))\n")
    p = subprocess.Popen([sys.executable, "-c", hold, lock, "0.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(disk.DiskPlanError) as e:
            disk.HostLock(lock, "me").__enter__()
        assert str(e.value) == (f"another modelfleet run holds the storage lock {lock} (pid=1 holder); "
                                "wait for it to finish")
        with disk.HostLock(lock, "me", wait_seconds=30) as held:  # the holder exits after 0.5 s
            assert held.fd is not None
    finally:
        p.kill()
        p.wait()


def test_root_spelling_without_resolving(tmp_path):
    link = tmp_path / "models"
    link.symlink_to("/etc")
    assert disk.check_models_root(str(link), resolve=False) == str(link)
    with pytest.raises(disk.DiskPlanError) as e:
        disk.check_models_root(str(link))
    assert "(after resolving symlinks)" in str(e.value)


def test_a_changed_target_names_both_identities(tmp_path):
    root = tmp_path / "m"
    target = root / "org--a" / ("a" * 40)
    _model(str(target))
    st = os.stat(target)
    with pytest.raises(disk.DiskPlanError) as e:
        disk.delete_model_dir(str(root), str(target), expect=(st.st_dev + 1, st.st_ino + 2))
    assert str(e.value) == (f"{target}: changed since it was planned (device/inode {st.st_dev}/{st.st_ino}, "
                            f"planned {st.st_dev + 1}/{st.st_ino + 2}); refusing to delete - plan again")
    assert target.is_dir()
