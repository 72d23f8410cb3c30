"""storage_reclaim run by Ansible on this machine against real directories: the fallback rule, the
host-wide lock, remove-after-verify, and bad input that deletes nothing."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def run_module(args: dict, check: bool = False) -> tuple[int, dict]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    cmd = ["ansible", "localhost", "-c", "local", "-i", "localhost,", "-m", "modelfleet.fleet.storage_reclaim",
           "-a", json.dumps(args), "-e", f"ansible_python_interpreter={sys.executable}"]
    if check:
        cmd.append("--check")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    out = json.loads(r.stdout)
    return r.returncode, out["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.fixture
def root(tmp_path):
    """The models root on a private 16 MiB tmpfs, so its free space moves only with what the test does."""
    r = tmp_path / "models"
    r.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(r)], capture_output=True, text=True)
    assert m.returncode == 0, f"this test mounts a tmpfs and needs root: {m.stderr}"
    yield from _populate(r)
    subprocess.run(["umount", str(r)], check=True)


def _populate(r):
    for name, mib, age in (("org--fallback/" + "a" * 40, 4, 100), ("org--other/" + "b" * 40, 2, 200)):
        d = r / name
        (d / ".modelfleet").mkdir(parents=True)
        (d / "w.safetensors").write_bytes(os.urandom(mib * 2**20))
        (d / ".modelfleet" / "complete").touch()
        (d / ".modelfleet" / "last_used").touch()
        os.utime(d / ".modelfleet" / "last_used", (age, age))
    yield r


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def base(models, tmp_path, **kw):
    root = models
    a = {"root": str(root), "log_path": str(tmp_path / "log.jsonl"), "lock_path": str(tmp_path / "lock"),
         "explicit": [str(root / "org--fallback" / ("a" * 40))], "fallback": [str(root / "org--fallback" / ("a" * 40))],
         # this machine has no systemd as PID 1: the explicit opt-out (test_unreadable_units_fail_closed below)
         "read_units": False}
    a.update({k: str(v) if k == "root" else v for k, v in kw.items()})
    return a


def test_fallback_kept_when_space_allows_then_removed_after_verify(root, tmp_path):
    fb = root / "org--fallback" / ("a" * 40)
    rc, res = run_module(base(root, tmp_path, required_bytes=2**20))
    assert rc == 0 and not res["changed"] and fb.exists()
    assert [d["path"] for d in res["plan"]["delete_after_verify"]] == [str(fb)]
    rc, res = run_module(base(root, tmp_path, mode="remove_explicit"), check=True)
    assert rc == 0 and res["changed"] and fb.exists() and res["would_delete"] == [str(fb)]
    rc, res = run_module(base(root, tmp_path, mode="remove_explicit"))
    assert rc == 0 and res["changed"] and not fb.exists()
    assert (root / "org--other" / ("b" * 40)).exists()
    log = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert log[0]["path"] == str(fb) and log[0]["bytes"] >= 4 * 2**20 and log[0]["mode"] == "remove_explicit"


def test_fallback_needed_now_requires_the_flag(root, tmp_path):
    fb = root / "org--fallback" / ("a" * 40)
    need = _free(root) + 3 * 2**20  # only deleting the 4 MiB fallback covers it
    rc, res = run_module(base(root, tmp_path, required_bytes=need))
    assert rc != 0 and fb.exists()
    assert "does not allow keeping the fallback" in res["msg"] and "Nothing was deleted" in res["msg"]
    rc, res = run_module(base(root, tmp_path, required_bytes=need, allow_delete_fallback=True))
    assert rc == 0 and not fb.exists() and [d["path"] for d in res["deleted"]] == [str(fb)]


def test_lock_held_by_another_run(root, tmp_path):
    lock = tmp_path / "lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"pid=1 other-run")
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        rc, res = run_module(base(root, tmp_path, required_bytes=_free(root) + 3 * 2**20, allow_delete_fallback=True))
    finally:
        os.close(fd)
    assert rc != 0 and "holds the storage lock" in res["msg"] and "other-run" in res["msg"]
    assert (root / "org--fallback" / ("a" * 40)).exists()


@pytest.mark.parametrize("kw,needle", [
    ({"root": "/nonexistent-models"}, "does not exist"),
    ({"required_bytes": -1}, "cannot be negative"),
    ({"required_bytes": "a lot"}, "not a size"),
    ({"protected": ["/etc"]}, "outside the models root"),
])
def test_bad_input_deletes_nothing(root, tmp_path, kw, needle):
    before = sorted(str(p) for p in root.rglob("*"))
    rc, res = run_module(base(root, tmp_path, **{"required_bytes": 10**15, "allow_delete_fallback": True, **kw}))
    assert rc != 0 and needle in res["msg"], res.get("msg")
    assert sorted(str(p) for p in root.rglob("*")) == before


def test_root_not_a_directory(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    rc, res = run_module({"root": str(f), "required_bytes": 1, "lock_path": str(tmp_path / "l")})
    assert rc != 0 and "is not a folder" in res["msg"] and "set the right root" in res["msg"]


def test_unreadable_units_fail_closed(root, tmp_path):
    """systemctl cannot be read here (no systemd as PID 1): without the explicit opt-out the module fails,
    names the problem and the fix, and deletes nothing - even with a shortfall only a deletion covers."""
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    args = base(root, tmp_path, required_bytes=15 * 2**20)
    del args["read_units"]
    rc, res = run_module(args)
    assert rc != 0 and res["failed"]
    assert "cannot read the host's services" in res["msg"] and "storage_cleanup_read_units: false" in res["msg"]
    assert "Traceback" not in json.dumps(res)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
