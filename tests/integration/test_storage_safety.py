"""Storage guarantees on real trees (issue 19): the real planner and the real deletion on a tmpfs, with
folders that are not models, nested candidates, symlinks at every level, hostile roots, processes that hold
a model, a symlink swapped in between planning and deleting, and systemctl that cannot be read.

Every deleting test snapshots every inode outside what the plan may delete (inside and outside the root)
and checks none of them changed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import in_use as in_use_mod
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.disk import (
    check_models_root,
    delete_model_dir,
    list_model_dirs,
    model_evidence,
    plan_host,
)
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import DiskPlanError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import property_examples
from tests.fs_snapshot import snapshot

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("storage-safety")]
REV = "c" * 40


@pytest.fixture(scope="module")
def fs(tmp_path_factory):
    """One 64 MiB tmpfs for the module; each test works in its own folder on it."""
    base = tmp_path_factory.mktemp("safety")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(base)], capture_output=True, text=True)
    assert r.returncode == 0, f"this test mounts a tmpfs and needs root: {r.stderr}"
    yield base
    subprocess.run(["umount", "-l", str(base)], check=False)


_n = [0]


@pytest.fixture
def area(fs):
    _n[0] += 1
    a = fs / f"t{_n[0]}"
    (a / "models").mkdir(parents=True)
    (a / "outside").mkdir()
    return a


def make_model(path, size=4096, marker=True):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    (path / "model-00001-of-00001.safetensors").write_bytes(os.urandom(size))
    if marker:
        (path / ".modelfleet").mkdir(exist_ok=True)
        (path / ".modelfleet" / "complete").touch()


# ------------------------------------------------------------------------------------------ the root
@pytest.mark.parametrize("bad,needle", [
    ("", "empty"), ("models", "relative"), ("/", "is /"), ("//", "is /"), ("/x/..", "'..'"),
    ("/models/../etc", "'..'"), ("/etc", "system folder /etc"), ("/var/lib", "system folder /var/lib"),
    ("/boot", "system folder /boot"), ("/models\nrm", "control character"), (None, "empty"),
])
def test_bad_roots_refused_everywhere(bad, needle):
    with pytest.raises(DiskPlanError, match=needle):
        check_models_root(bad)
    with pytest.raises(DiskPlanError, match=needle):
        plan_host(root=bad, required_bytes=1, read_units=False)


def test_a_root_that_resolves_to_a_system_folder_is_refused(area):
    link = area / "models-link"
    link.symlink_to("/etc")
    with pytest.raises(DiskPlanError, match="system folder /etc .after resolving symlinks"):
        check_models_root(str(link))
    assert check_models_root(str(area / "models")) == str(area / "models")


# ------------------------------------------------------------------------------------------ recognition
def test_only_models_are_candidates(area):
    root = area / "models"
    make_model(root / "org--llama" / REV)                               # modelfleet layout
    make_model(root / "handplaced", marker=False)                       # a checkpoint by content
    (root / "datasets").mkdir()                                         # parquet files: not a model
    (root / "datasets" / "train.parquet").write_bytes(b"PAR1" * 100)
    (root / "weights-only").mkdir()                                     # weights without config.json
    (root / "weights-only" / "x.safetensors").write_bytes(b"0" * 64)
    hub = root / "models--org--hubbed"                                  # the hub cache layout
    (hub / "blobs").mkdir(parents=True)
    (hub / "blobs" / "aa").write_text("{}")
    (hub / "blobs" / "bb").write_bytes(b"w" * 64)
    snap = hub / "snapshots" / REV
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/aa")
    (snap / "model.safetensors").symlink_to("../../blobs/bb")
    fifo_model = root / "fifo"
    fifo_model.mkdir()
    os.mkfifo(fifo_model / "config.json")                               # never opened, never a model
    (fifo_model / "w.safetensors").write_bytes(b"0")
    got = {os.path.relpath(c["path"], root): c["model"] for c in list_model_dirs(str(root))}
    assert got == {f"org--llama/{REV}": True, "handplaced": True, "datasets": False, "weights-only": False,
                   "models--org--hubbed": True, "fifo": False}
    assert model_evidence(str(hub)).startswith("hub cache layout")


def test_a_non_model_is_never_deleted_even_when_named_and_oldest(area):
    root = area / "models"
    (root / "datasets").mkdir()
    (root / "datasets" / "train.parquet").write_bytes(os.urandom(8192))
    os.utime(root / "datasets", (1, 1))
    make_model(root / "org--m" / REV, size=8192)
    before = snapshot(area)
    plan = plan_host(root=str(root), required_bytes=10**12, explicit=[str(root / "datasets")], read_units=False)
    assert not plan["feasible"] and plan["delete"] == []
    assert str(root / "datasets") in plan["not_models"]
    assert any(r["path"] == str(root / "datasets") and r["reason"].startswith("not a model") for r in plan["refused"])
    with pytest.raises(DiskPlanError, match="not a model"):
        st = os.lstat(root / "datasets")
        delete_model_dir(str(root), str(root / "datasets"), expect=(st.st_dev, st.st_ino))
    assert snapshot(area) == before


# ------------------------------------------------------------------------------------------ property test
@st.composite
def trees(draw):
    """A root with models, non-models, nested folders and symlinks at every level, plus an outside tree
    that symlinks point into."""
    spec = []
    for i in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["model", "model", "model-hubcache", "handplaced", "nonmodel", "link-root",
                                     "link-org", "link-rev", "nested", "inuse"]))
        spec.append((i, kind, draw(st.integers(0, 10**9))))
    required = draw(st.integers(0, 200_000))
    named = draw(st.lists(st.integers(0, 6), max_size=3))
    return spec, required, named


def _build(area, spec):
    root, out = area / "models", area / "outside"
    make_model(out / "victim" / REV)           # what a symlink would lead a naive deleter into
    (out / "victim" / "keep.txt").write_text("outside")
    busy = []
    for i, kind, age in spec:
        if kind == "model":
            make_model(root / f"org--m{i}" / REV, size=4096 * (i + 1))
        elif kind == "model-hubcache":
            snap = root / f"models--org--h{i}" / "snapshots" / REV
            make_model(snap, marker=False)
        elif kind == "handplaced":
            make_model(root / f"hand{i}", marker=False)
        elif kind == "nonmodel":
            (root / f"data{i}").mkdir()
            (root / f"data{i}" / "rows.parquet").write_bytes(os.urandom(2048))
        elif kind == "link-root":
            (root / f"lr{i}").symlink_to(out / "victim" / REV)
        elif kind == "link-org":
            (root / f"org--l{i}").symlink_to(out / "victim")
        elif kind == "link-rev":
            (root / f"org--r{i}").mkdir()
            (root / f"org--r{i}" / REV).symlink_to(out / "victim" / REV)
        elif kind == "nested":
            make_model(root / f"org--n{i}" / REV)
            make_model(root / f"org--n{i}" / REV / "inner", marker=True)  # a model inside a model
        elif kind == "inuse":
            make_model(root / f"org--u{i}" / REV, size=8192)
            busy.append(root / f"org--u{i}" / REV)
        for p in (root / f"org--m{i}", root / f"hand{i}", root / f"data{i}"):
            if p.exists() and not p.is_symlink():
                os.utime(p, (age, age))
    return busy


@settings(max_examples=property_examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(t=trees())
def test_real_planner_and_deletion_touch_nothing_they_must_not(fs, t):
    spec, required, named = t
    _n[0] += 1
    area = fs / f"p{_n[0]}"
    (area / "models").mkdir(parents=True)
    (area / "outside").mkdir()
    root = area / "models"
    busy = _build(area, spec)
    holders = []
    for b in busy:  # a process holds the weights open (no unit, no path on its command line)
        f = b / "model-00001-of-00001.safetensors"
        p = subprocess.Popen([sys.executable, "-c", "import os,sys,time; f=open(os.environ['F'],'rb'); "
                              "print('ok', flush=True); time.sleep(60)"], env={**os.environ, "F": str(f)},
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ok"
        holders.append(p)
    try:
        cands = list_model_dirs(str(root))
        explicit = [cands[i % len(cands)]["path"] for i in named] if cands else []
        plan = plan_host(root=str(root), required_bytes=required + 10**9, headroom_bytes=0,
                         explicit=explicit, read_units=False)
        allowed = {d["path"] for d in plan["would_delete_if_feasible"] + plan["delete"]}
        before = snapshot(area)
        # delete everything the planner allows (it is infeasible on purpose: what it would delete is the most)
        for d in plan["would_delete_if_feasible"] + plan["delete"]:
            delete_model_dir(str(root), d["path"], expect=(d["dev"], d["ino"]))
        after = snapshot(area)
        for path, ident in before.items():
            if any(path == a or path.startswith(a + "/") for a in allowed):
                continue
            if os.path.basename(path).startswith(".trash-"):
                continue
            if path in after:
                assert after[path] == ident, path
            else:  # only an emptied org folder may go with its last revision
                assert os.path.basename(path).startswith(("org--", "models--")) and any(
                    a.startswith(path + "/") for a in allowed), path
        for a in allowed:
            assert a.startswith(str(root) + "/") and not os.path.islink(a.rsplit("/", 1)[0])
            assert "outside" not in os.path.relpath(a, area).split("/")[0]
        for b in busy:
            assert str(b) not in allowed and (b / "model-00001-of-00001.safetensors").exists()
        assert (area / "outside" / "victim" / "keep.txt").read_text() == "outside"
        assert all(c["model"] for c in cands if c["path"] in allowed)
    finally:
        for p in holders:
            p.kill()
            p.wait()


# ------------------------------------------------------------------------------------------ races
def _plan_one(area):
    """A root with one model, planned for deletion after verification: (root, the planned entry)."""
    root = area / "models"
    make_model(root / "org--m" / REV)
    plan = plan_host(root=str(root), required_bytes=0, explicit=[str(root / "org--m" / REV)], read_units=False)
    (d,) = plan["delete_after_verify"]
    return root, d


def _refused_without_a_trace(area, root, d, match):
    before = snapshot(area)
    with pytest.raises(DiskPlanError, match=match):
        delete_model_dir(str(root), d["path"], expect=(d["dev"], d["ino"]))
    assert snapshot(area) == before


def test_parent_swapped_for_a_symlink_between_plan_and_delete(area):
    out = area / "outside"
    make_model(out / "org--m" / REV)  # same layout outside: a path-string deleter would follow the link
    root, d = _plan_one(area)
    os.rename(root / "org--m", area / "moved-away")
    (root / "org--m").symlink_to(out / "org--m")
    _refused_without_a_trace(area, root, d, "without symlinks")
    assert (out / "org--m" / REV / ".modelfleet" / "complete").exists()


def test_target_replaced_between_plan_and_delete(area):
    root, d = _plan_one(area)
    os.rename(root / "org--m" / REV, area / "planned-one")
    make_model(root / "org--m" / REV)  # another folder under the same name (a new download, say)
    _refused_without_a_trace(area, root, d, "changed since it was planned")


def test_root_swapped_for_a_symlink(area):
    root, d = _plan_one(area)
    os.rename(root, area / "real-models")
    (area / "models").symlink_to(area / "real-models")
    _refused_without_a_trace(area, root, d, "cannot be opened without following a symlink")


# ------------------------------------------------------------------------------------------ in use
def test_processes_that_use_a_model_protect_it(area):
    root = area / "models"
    for name in ("held", "mapped", "cwd", "named", "sibling-new"):
        make_model(root / f"org--{name}" / REV, size=8192)
    make_model(root / "org--sibling-new" / ("d" * 40), size=8192)  # another revision of the same model
    w = "model-00001-of-00001.safetensors"
    code = {"held": "f=open(os.environ['P'] + '/" + w + "','rb')",
            "mapped": "import mmap; f=open(os.environ['P'] + '/" + w + "','rb'); "
                      "m=mmap.mmap(f.fileno(),0,access=mmap.ACCESS_READ); f.close()",
            "cwd": "os.chdir(os.environ['P'])"}
    procs = []
    try:
        for name, c in code.items():
            p = subprocess.Popen([sys.executable, "-c", f"import os,time\n{c}\nprint('ok',flush=True)\ntime.sleep(60)"],
                                 env={**os.environ, "P": str(root / f"org--{name}" / REV)}, stdout=subprocess.PIPE,
                                 text=True)
            assert p.stdout.readline().strip() == "ok"
            procs.append(p)
        # named on a command line only (nohup vllm serve /models/...), and a sibling revision named in full
        idle = [sys.executable, "-c", "import time; time.sleep(60)"]
        procs.append(subprocess.Popen([*idle, "serve", str(root / "org--named" / REV)]))
        procs.append(subprocess.Popen([*idle, "serve", str(root / "org--sibling-new" / ("d" * 40))]))
        time.sleep(0.2)
        plan = plan_host(root=str(root), required_bytes=10**12, read_units=False)
        used = {os.path.relpath(u["path"], root) for u in plan["in_use"]}
        assert {f"org--{n}/{REV}" for n in ("held", "mapped", "cwd", "named")} <= used
        assert "org--sibling-new/" + "d" * 40 in used and f"org--sibling-new/{REV}" not in used
        assert all(u["kind"] == "process" and u["name"].startswith("pid ") for u in plan["in_use"])
        would = {os.path.relpath(d["path"], root) for d in plan["would_delete_if_feasible"]}
        assert would == {f"org--sibling-new/{REV}"}
    finally:
        for p in procs:
            p.kill()
            p.wait()


class FakeRun:
    """systemctl as it answers on a host: canned stdout per call, or a failure."""

    def __init__(self, listing="", show="", rc=0, exc=None):
        self.listing, self.show, self.rc, self.exc, self.calls = listing, show, rc, exc, []

    def __call__(self, argv, **kw):
        self.calls.append(argv)
        if self.exc:
            raise self.exc
        out = self.listing if argv[1] == "list-units" else self.show
        return subprocess.CompletedProcess(argv, self.rc, out, "Failed to connect to bus" if self.rc else "")


@pytest.mark.parametrize("run", [FakeRun(rc=1), FakeRun(exc=FileNotFoundError("systemctl"))])
def test_unreadable_systemctl_fails_the_plan_and_deletes_nothing(area, run):
    root = area / "models"
    make_model(root / "org--m" / REV)
    before = snapshot(area)
    with pytest.raises(DiskPlanError, match="cannot read the host's services.*--no-units"):
        plan_host(root=str(root), required_bytes=10**12, run=run)
    assert snapshot(area) == before


def test_units_protect_whatever_they_reference(area, tmp_path):
    root = area / "models"
    names = ["vllm", "docker", "space dir", "wrapper", "restarting", "envfile", "stopped"]
    for n in names:
        make_model(root / f"org--{n.replace(' ', '_')}" / REV)
    make_model(root / "with space", marker=False)
    script = tmp_path / "start-minimax.sh"
    script.write_text(f"#!/bin/sh\nexec vllm serve {root}/org--wrapper/{REV} --tp 8\n")
    envfile = tmp_path / "model.env"
    envfile.write_text(f"MODEL_DIR={root}/org--envfile/{REV}\n")
    listing = "\n".join([
        "a.service loaded active running A", "b.service loaded active running B", "c.service loaded active running C",
        "d.service loaded active running D", "e.service loaded activating auto-restart E",
        "f.service loaded active running F", "g.service loaded inactive dead G",
        "ssh.socket loaded active listening S"])
    head = "ActiveState=active\nSubState=running\nExecStart={ path="
    show = "\n\n".join([
        f"Id=a.service\n{head}/opt/v/bin/python ; argv[]=/opt/v/bin/"
        f"python -m vllm.entrypoints.openai.api_server --model {root}/org--vllm/{REV} --port 8000 ; }}",
        f"Id=b.service\n{head}/usr/bin/docker ; argv[]=/usr/bin/docker"
        f" run --gpus all -v {root}/org--docker/{REV}:/model:ro vllm/vllm-openai --model /model ; }}",
        f"Id=c.service\n{head}/usr/bin/sglang ; argv[]=sglang "
        f"--model-path {root}/with space --port 30000 ; }}",
        f"Id=d.service\n{head}{script} ; argv[]={script} ; }}",
        f"Id=e.service\nActiveState=activating\nSubState=auto-restart\nWorkingDirectory={root}/org--restarting/{REV}",
        f"Id=f.service\nActiveState=active\nSubState=running\nEnvironmentFiles={envfile} (ignore_errors=no)"])
    plan = plan_host(root=str(root), required_bytes=10**12, run=FakeRun(listing, show))
    used = {os.path.relpath(u["path"], root): u["name"] for u in plan["in_use"]}
    assert set(used) == {f"org--{n}/{REV}" for n in ("vllm", "docker", "wrapper", "restarting", "envfile")} | {
        "with space"}
    assert used[f"org--restarting/{REV}"] == "e.service (activating/auto-restart)"
    would = {os.path.relpath(d["path"], root) for d in plan["would_delete_if_feasible"]}
    assert would == {f"org--stopped/{REV}", f"org--space_dir/{REV}"}


def test_references_are_exact_path_matches():
    src = [{"kind": "unit", "name": "u", "text": "--model /models/a/r1 -v /models/bb:/x"}]
    hits = {h["path"] for h in in_use_mod.references(src, ["/models/a/r1", "/models/a/r10", "/models/b",
                                                           "/models/bb/r", "/models/a/r2"], "/models")}
    assert hits == {"/models/a/r1", "/models/bb/r"}


# ------------------------------------------------------------------------------------------ a killed download
def test_a_killed_download_is_credited_and_the_rerun_deletes_no_more(area):
    """20 of 24 units already in staging: the re-run's plan needs only the rest and deletes nothing the first
    plan would not have (the issue's case deleted two other models)."""
    root = area / "models"
    for name, age in (("old", 10), ("older", 5)):
        make_model(root / f"org--{name}" / REV, size=2 * 2**20)
        os.utime(root / f"org--{name}" / REV / ".modelfleet" / "complete", (age, age))
    target = root / "org--new" / REV
    staging = root / ".staging" / "org--new" / REV
    free = os.statvfs(root).f_bavail * os.statvfs(root).f_frsize
    required = free + 2**20  # a shortfall of 1 MiB: one 2 MiB model covers it
    first = plan_host(root=str(root), required_bytes=required, deploying=[str(target), str(staging)],
                      read_units=False)
    assert len(first["delete"]) == 1
    staging.mkdir(parents=True)  # the download ran and was killed after writing 16 MiB of shards
    (staging / "model-00001-of-00002.safetensors").write_bytes(os.urandom(16 * 2**20))
    rerun = plan_host(root=str(root), required_bytes=required, deploying=[str(target), str(staging)],
                      read_units=False)
    assert rerun["present_measured_bytes"] >= 16 * 2**20
    assert rerun["feasible"] and [d["path"] for d in rerun["delete"]] == [d["path"] for d in first["delete"]]
    assert rerun["shortfall_bytes"] == first["shortfall_bytes"]
    # without the credit the same re-run would need 16 MiB more than is free and would delete both models
    blind = plan_host(root=str(root), required_bytes=required, read_units=False)
    assert blind["shortfall_bytes"] >= first["shortfall_bytes"] + 16 * 2**20


# ------------------------------------------------------------------------------------------ plan_host's inputs
def _free(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_plan_host_maps_every_named_path_through_a_linked_root(area):
    """The root given through a symlink: every path named under that spelling (explicit, protected, in use,
    deploying, fallback) is the same folder under the resolved root, and each guard holds."""
    real = area / "models"
    link = area / "models-link"
    os.symlink(real, link)
    names = ("explicit", "protected", "used", "deploying", "fallback", "free")
    for age, n in enumerate(names, start=1):
        make_model(real / f"org--{n}" / REV, size=256 << 10)
        os.utime(real / f"org--{n}" / REV / ".modelfleet" / "complete", (age, age))
    at = {n: str(link / f"org--{n}" / REV) for n in names}
    # about 260 KiB per model; the deploying one counts as present: the explicit and the free model do not
    # cover the shortfall, the fallback too does
    required = _free(real) + (960 << 10)
    plan = plan_host(root=str(link), required_bytes=required, headroom_bytes=0, explicit=[at["explicit"]],
                     protected=[at["protected"]], in_use=[at["used"]], deploying=[at["deploying"]],
                     fallback=[at["fallback"]], read_units=False)
    assert plan["root"] == str(real)
    refused = {os.path.relpath(r["path"], real): r["reason"] for r in plan["refused"]}
    assert refused == {f"org--protected/{REV}": "protected",
                       f"org--used/{REV}": "in use by a live unit or a running process",
                       f"org--deploying/{REV}": "the model being deployed"}
    deleted = [os.path.relpath(d["path"], real) for d in plan["delete"]]
    assert deleted[0] == f"org--explicit/{REV}" and plan["delete"][0]["explicit"] is True
    # nothing but the fallback was left to cover the rest: deleted early, and said so
    assert f"org--fallback/{REV}" in deleted
    assert plan["fallback_deleted_early"] == [str(real / "org--fallback" / REV)]


def test_plan_host_keeps_the_fallback_when_others_cover_it(area):
    real = area / "models"
    for age, n in enumerate(("fallback", "other"), start=1):
        make_model(real / f"org--{n}" / REV, size=256 << 10)
        os.utime(real / f"org--{n}" / REV / ".modelfleet" / "complete", (age, age))
    plan = plan_host(root=str(real), required_bytes=_free(real) + (64 << 10),
                     fallback=[str(real / "org--fallback" / REV)], read_units=False)
    assert [os.path.relpath(d["path"], real) for d in plan["delete"]] == [f"org--other/{REV}"]
    assert plan["fallback_deleted_early"] == []


def test_plan_host_present_bytes_sum_real_folders_only(area):
    real = area / "models"
    stage1, stage2 = real / ".staging" / "a", real / ".staging" / "b"
    for d, size in ((stage1, 64 << 10), (stage2, 128 << 10)):
        d.mkdir(parents=True)
        (d / "part").write_bytes(os.urandom(size))
    os.symlink(stage2, real / ".staging" / "link")  # a link to a folder already counted is not counted again
    expect = sum(os.lstat(p).st_blocks * 512 for p in (stage1, stage1 / "part", stage2, stage2 / "part"))
    plan = plan_host(root=str(real), required_bytes=10 << 20, headroom_bytes=1 << 20, defer_explicit=False,
                     deploying=[str(stage1), str(stage2), str(real / ".staging" / "link"), str(real / "absent")],
                     read_units=False)
    assert plan["present_measured_bytes"] == expect == plan["present_bytes"]
    assert plan["need_bytes"] == (10 << 20) + (1 << 20) - expect
    # a caller's larger figure wins; the measured one is capped at the model's size
    assert plan_host(root=str(real), required_bytes=10 << 20, present_bytes=5 << 20, deploying=[str(stage1)],
                     read_units=False)["present_bytes"] == 5 << 20
    assert plan_host(root=str(real), required_bytes=1000, deploying=[str(stage1)],
                     read_units=False)["present_measured_bytes"] == 1000


def test_plan_host_reads_units_through_the_given_runner(area):
    real = area / "models"
    make_model(real / "org--a" / REV)
    listing = "a.service loaded active running A\n"
    show = f"Id=a.service\nActiveState=active\nSubState=running\nWorkingDirectory={real}/org--a/{REV}\n"
    plan = plan_host(root=str(real), required_bytes=1, run=FakeRun(listing, show))
    assert plan["units_read"] is True
    assert plan["in_use"] == [{"path": str(real / "org--a" / REV), "kind": "unit",
                               "name": "a.service (active/running)"}]


def test_plan_host_missing_root(area):
    with pytest.raises(DiskPlanError) as e:
        plan_host(root=str(area / "nothing"), required_bytes=1, read_units=False)
    assert str(e.value) == (f"models root {area / 'nothing'}: does not exist or is not a folder; create it "
                            f"(mkdir -p {area / 'nothing'}) or set the right root")
