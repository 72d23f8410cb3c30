"""disk_plan's arithmetic: property tests over random model trees, the seed's case with its figures,
real measurements on a real directory tree, and bad input."""

from __future__ import annotations

import os
import posixpath

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.disk import (
    dir_usage,
    list_model_dirs,
    measure_fs,
    plan_disk,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import DiskPlanError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import GB
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import property_examples

ROOT = "/models"


def _inside(c, p):
    return p == "/" or c == p or c.startswith(p.rstrip("/") + "/")


@st.composite
def trees(draw):
    n = draw(st.integers(min_value=0, max_value=12))
    links: dict[str, str] = {}
    cands = []
    for i in range(n):
        kind = draw(st.sampled_from(["dir", "dir", "dir", "link_out", "link_in", "dotdot", "root"]))
        name = f"{ROOT}/m{i}"
        if kind == "link_out":
            links[name] = draw(st.sampled_from(["/etc", "/home/user/models/x", "/", "/modelsX/y"]))
        elif kind == "link_in":
            links[name] = f"{ROOT}/m{draw(st.integers(0, max(0, n - 1)))}"
        elif kind == "dotdot":
            name = f"{ROOT}/m{i}/../../var/lib{i}"
        elif kind == "root":
            name = f"{ROOT}/m{i}/.."
        cands.append({"path": name, "allocated_bytes": draw(st.integers(0, 800 * GB)),
                      "last_used": draw(st.floats(0, 1e9)), "symlink": kind.startswith("link"),
                      "model": draw(st.sampled_from([True, True, True, False]))})
    for c in cands:
        c["exclusive_allocated_bytes"] = c["allocated_bytes"]
    paths = [c["path"] for c in cands]
    protected = draw(st.lists(st.sampled_from(paths), max_size=3)) if paths else []
    in_use = draw(st.lists(st.sampled_from(paths), max_size=3)) if paths else []
    deploying = draw(st.lists(st.sampled_from(paths), max_size=1)) if paths else []
    explicit = draw(st.lists(st.sampled_from(paths + [f"{ROOT}/absent", "/etc"]), max_size=4))
    keep = draw(st.lists(st.sampled_from(paths), max_size=2)) if paths else []
    free = draw(st.integers(0, 2000 * GB))
    required = draw(st.integers(0, 1500 * GB))
    return dict(cands=cands, links=links, protected=protected, in_use=in_use, deploying=deploying, keep=keep,
                explicit=explicit, free=free, required=required,
                headroom=draw(st.integers(0, 100 * GB)), pct=draw(st.floats(0, 20)))


def _resolver(links):
    def realpath(p):
        p = posixpath.normpath(p)
        for _ in range(10):
            hit = next((src for src in links if p == src or p.startswith(src + "/")), None)
            if not hit:
                break
            p = posixpath.normpath(links[hit] + p[len(hit):])
        return p
    return realpath


@settings(max_examples=property_examples(10_000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_no_plan_ever_deletes_a_forbidden_path(t):
    rp = _resolver(t["links"])
    # protected paths outside the root are a usage error, tested separately
    protected = [p for p in t["protected"] if _inside(rp(p), ROOT)]
    plan = plan_disk(root=ROOT, free_bytes=t["free"], total_bytes=2000 * GB, required_bytes=t["required"],
                     candidates=t["cands"], headroom_bytes=t["headroom"], headroom_percent=t["pct"],
                     explicit=tuple(t["explicit"]), protected=tuple(protected), in_use=tuple(t["in_use"]),
                     deploying=tuple(t["deploying"]), keep_until_verified=tuple(t["keep"]), realpath=rp)
    forbidden = [rp(p) for p in protected + t["in_use"] + t["deploying"]]
    by_path = {c["path"]: c for c in t["cands"]}
    for d in plan["delete"]:  # a fallback is never deleted before the new model is verified
        assert not any(_inside(rp(d["path"]), rp(k)) or _inside(rp(k), rp(d["path"])) for k in t["keep"]), d
    for d in plan["delete"] + plan["delete_after_verify"]:
        r = rp(d["path"])
        assert _inside(r, ROOT) and r != ROOT, d
        assert not by_path[d["path"]]["symlink"]
        assert by_path[d["path"]]["model"] is True, d  # never a folder that is not a model
        for f in forbidden:
            assert not _inside(r, f) and not _inside(f, r), (d, f)
    if plan["feasible"]:
        assert plan["free_bytes"] + sum(d["bytes"] for d in plan["delete"]) >= plan["need_bytes"]
        # the shortest prefix: dropping the last deletion would not cover the shortfall
        if plan["delete"]:
            assert sum(d["bytes"] for d in plan["delete"][:-1]) < plan["shortfall_bytes"]
    else:
        assert plan["delete"] == [] and "cannot make room" in plan["message"]


def test_the_seeds_case():
    """1.7 TB volume, 755 GB used by a 540 GB NVFP4 Kimi-K2.5 and a 215 GB MiniMax-M2.5 (in use by its
    unit), 595 GB needed, the user asks to free the NVFP4 model."""
    total, used = 1700 * GB, 755 * GB
    nvfp4 = {"path": "/models/Kimi-K2.5-NVFP4", "allocated_bytes": 540 * GB, "exclusive_allocated_bytes": 540 * GB,
             "last_used": 100.0, "model": True}
    minimax = {"path": "/models/MiniMax-M2.5", "allocated_bytes": 215 * GB, "exclusive_allocated_bytes": 215 * GB,
               "last_used": 50.0, "model": True}
    common = dict(root="/models", free_bytes=total - used, total_bytes=total, required_bytes=595 * GB,
                  candidates=[nvfp4, minimax], explicit=("/models/Kimi-K2.5-NVFP4",),
                  in_use=("/models/MiniMax-M2.5",), realpath=lambda p: p)
    plan = plan_disk(**common, headroom_percent=5)
    # space allows (945 GB free >= 595 + 85 GB headroom): the fallback stays until the new model is verified
    assert plan["shortfall_bytes"] == 0 and plan["delete"] == []
    assert [(d["path"], d["bytes"]) for d in plan["delete_after_verify"]] == [("/models/Kimi-K2.5-NVFP4", 540 * GB)]
    assert {"path": "/models/MiniMax-M2.5", "reason": "in use by a live unit or a running process"} in plan["refused"]
    # after fetching and removing the fallback: 945 + 540 - 595 = 890 GB = 828.9 GiB
    assert plan["free_after_verify_cleanup_bytes"] == 890 * GB
    assert plan["figures"]["free_after_verify_cleanup"] == {"bytes": 890 * GB, "gb": 890.0, "gib": 828.877}
    # with a 400 GB headroom the fallback must go first - and only the fallback
    plan = plan_disk(**common, headroom_bytes=400 * GB)
    assert [d["path"] for d in plan["delete"]] == ["/models/Kimi-K2.5-NVFP4"] and plan["feasible"]
    assert plan["free_after_delete_bytes"] == 1485 * GB
    assert plan["figures"]["free_after_delete"] == {"bytes": 1485 * GB, "gb": 1485.0, "gib": 1383.014}
    # "1700 - 215 = 1485 GB": right in GB; df -h shows that as 1.4T (TiB): 1485e9 / 2**40 = 1.35
    assert round(1485 * GB / 2**40, 2) == 1.35


def test_infeasible_plan_deletes_nothing():
    c = [{"path": "/models/a", "allocated_bytes": 10 * GB, "exclusive_allocated_bytes": 10 * GB, "last_used": 1.0,
          "model": True}]
    plan = plan_disk(root="/models", free_bytes=5 * GB, total_bytes=100 * GB, required_bytes=50 * GB, candidates=c,
                     realpath=lambda p: p)
    assert not plan["feasible"] and plan["delete"] == [] and plan["would_delete_if_feasible"]
    assert "cannot make room" in plan["message"]


def test_lru_order_and_partial_download_counts_by_blocks():
    c = [{"path": f"/models/m{i}", "allocated_bytes": 10 * GB, "exclusive_allocated_bytes": 10 * GB,
          "last_used": float(t), "model": True} for i, t in enumerate([30, 10, 20])]
    plan = plan_disk(root="/models", free_bytes=0, total_bytes=100 * GB, required_bytes=25 * GB, candidates=c,
                     present_bytes=10 * GB, realpath=lambda p: p)
    assert [d["path"] for d in plan["delete"]] == ["/models/m1", "/models/m2"]  # oldest first, 15 GB needed


@pytest.mark.parametrize("kw,needle", [
    ({"required_bytes": -1}, "must be >= 0"),
    ({"required_bytes": "595GB"}, "must be an integer"),
    ({"required_bytes": True}, "must be an integer"),
    ({"headroom_bytes": -5}, "headroom bytes"),
    ({"headroom_percent": 150}, "headroom percent"),
    ({"protected": ("/etc",)}, "outside the models root"),
])
def test_bad_input(kw, needle):
    args = dict(root="/models", free_bytes=0, total_bytes=1, required_bytes=1, candidates=[], realpath=lambda p: p)
    args.update(kw)
    with pytest.raises(DiskPlanError, match=needle):
        plan_disk(**args)


@pytest.fixture
def private_fs(tmp_path):
    """A 32 MiB tmpfs of the test's own, so free space moves only with what the test does."""
    import subprocess

    root = tmp_path / "models"
    root.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(root)], capture_output=True, text=True)
    assert r.returncode == 0, f"this test mounts a tmpfs and needs root: {r.stderr}"
    yield root
    subprocess.run(["umount", str(root)], check=True)


def test_real_tree_measurements(private_fs):
    root = private_fs
    m = root / "org--model" / ("a" * 40)
    m.mkdir(parents=True)
    (m / "dense.bin").write_bytes(os.urandom(256 * 1024))
    with open(m / "sparse.bin", "wb") as f:
        f.truncate(10 * 2**20)  # 10 MiB apparent, ~0 allocated
    os.link(m / "dense.bin", root / "hardlink-outside")  # shared inode: deleting m frees no blocks of it
    (root / "escape").symlink_to("/etc")
    (root / "handplaced").mkdir()
    (root / "handplaced" / "w.bin").write_bytes(b"x" * 8192)
    u = dir_usage(str(m))
    assert u["apparent_bytes"] == 256 * 1024 + 10 * 2**20
    assert 256 * 1024 <= u["allocated_bytes"] < 256 * 1024 + 2**20
    assert u["exclusive_allocated_bytes"] < 64 * 1024  # the dense file has a second link
    units = {os.path.relpath(x["path"], root): x for x in list_model_dirs(str(root))}
    assert set(units) == {"org--model/" + "a" * 40, "handplaced", "escape"}
    assert units["escape"]["symlink"] and units["escape"]["resolved"] == "/etc"
    # neither has config.json + weights nor modelfleet's marker: listed, never a model
    assert not units["escape"]["model"] and not units["handplaced"]["model"]
    assert not units["org--model/" + "a" * 40]["model"]  # weights without a config.json
    (m / "config.json").write_text("{}")
    (root / "handplaced" / "config.json").write_text("{}")
    units = {os.path.relpath(x["path"], root): x for x in list_model_dirs(str(root))}
    assert units["org--model/" + "a" * 40]["model"] and units["handplaced"]["model"]
    assert units["handplaced"]["evidence"].startswith("checkpoint")
    fs = measure_fs(str(root))
    st = os.statvfs(root)
    assert fs["free_bytes"] == st.f_bavail * st.f_frsize and fs["source"] == "statvfs f_bavail"
