"""Disk arithmetic for the models root: what an unprivileged writer can really use, what each model
directory really frees, and which deletions (if any) cover a shortfall - never touching a path outside
the root, the root itself, a protected path, a model an active unit serves, or the model being deployed.

`plan_disk` is pure (values in, plan out). The measuring helpers (`measure_fs`, `dir_usage`,
`list_model_dirs`) only read the filesystem; nothing in this module deletes anything."""

from __future__ import annotations

import os
import shutil
import subprocess

from ansible.module_utils.modelfleet import flock
from ansible.module_utils.modelfleet.errors import DiskPlanError
from ansible.module_utils.modelfleet.units import both_units, fmt_bytes

MARKER_DIR = ".modelfleet"
LAST_USED = "last_used"      # touched by hf_fetch (and vllm_service on start): the LRU clock
COMPLETE = "complete"


# --------------------------------------------------------------------------- measuring (read-only)
def _zfs_dataset(path: str) -> str | None:
    """The ZFS dataset holding `path`, if the path is on ZFS and the zfs tool is present."""
    if not shutil.which("zfs"):
        return None
    best = None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if fstype == "zfs" and (path == mnt or path.startswith(mnt.rstrip("/") + "/")):
                    if best is None or len(mnt) > len(best[1]):
                        best = (dev, mnt)
    except OSError:
        return None
    return best[0] if best else None


def measure_fs(path: str, run=subprocess.run) -> dict:
    """Free space as an unprivileged writer sees it (statvfs f_bavail, not f_bfree), or the ZFS
    dataset's `available` (quota, reservations and snapshots included) when the path is on ZFS."""
    st = os.statvfs(path)
    out = {
        "total_bytes": st.f_blocks * st.f_frsize,
        "free_bytes": st.f_bavail * st.f_frsize,
        "free_root_bytes": st.f_bfree * st.f_frsize,
        "reserved_bytes": (st.f_bfree - st.f_bavail) * st.f_frsize,
        "block_size": st.f_frsize,
        "source": "statvfs f_bavail",
    }
    ds = _zfs_dataset(os.path.realpath(path))
    if ds:
        r = run(["zfs", "get", "-Hp", "-o", "value", "available,used", ds], capture_output=True, text=True)
        if r.returncode == 0:
            avail, used = (int(x) for x in r.stdout.split())
            out.update(free_bytes=avail, total_bytes=avail + used, source=f"zfs dataset {ds} 'available'")
    return out


def dir_usage(path: str) -> dict:
    """Allocated (blocks held) and apparent bytes of a directory tree, symlinks not followed, each inode
    counted once. `exclusive_allocated_bytes` counts only inodes with no links outside this tree's
    count (what deleting the tree really frees)."""
    seen: dict = {}
    apparent = allocated = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames + dirnames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                seen[key][1] += 1
                continue
            seen[key] = [st, 1]
            apparent += st.st_size
            allocated += st.st_blocks * 512
    exclusive = sum(st.st_blocks * 512 for st, n in seen.values() if st.st_nlink <= n)
    try:
        allocated += os.lstat(path).st_blocks * 512
    except OSError:
        pass
    return {"apparent_bytes": apparent, "allocated_bytes": allocated, "exclusive_allocated_bytes": exclusive}


def _last_used(path: str) -> float:
    for p in (os.path.join(path, MARKER_DIR, LAST_USED), os.path.join(path, MARKER_DIR, COMPLETE), path):
        try:
            return os.stat(p).st_mtime
        except OSError:
            continue
    return 0.0


def list_model_dirs(root: str) -> list[dict]:
    """Deletion units under the models root: `<root>/<org>--<name>/<revision>` directories of
    modelfleet's layout, and any other top-level directory (a model placed by hand). Symlinks are
    listed with their resolved target so the planner can refuse those pointing out of the root."""
    out = []
    for entry in sorted(os.listdir(root)):
        if entry.startswith("."):
            continue  # .staging, .locks: modelfleet's own
        p = os.path.join(root, entry)
        if os.path.islink(p):
            out.append({"path": p, "resolved": os.path.realpath(p), "symlink": True, "allocated_bytes": 0,
                        "apparent_bytes": 0, "exclusive_allocated_bytes": 0, "last_used": 0.0})
            continue
        if not os.path.isdir(p):
            continue
        subs = [os.path.join(p, s) for s in sorted(os.listdir(p)) if len(s) == 40 and os.path.isdir(os.path.join(p, s))]
        units = subs if "--" in entry and subs else [p]
        for u in units:
            usage = dir_usage(u)
            out.append({"path": u, "resolved": os.path.realpath(u), "symlink": os.path.islink(u),
                        "last_used": _last_used(u), "complete": os.path.exists(os.path.join(u, MARKER_DIR, COMPLETE)),
                        **usage})
    return out


# --------------------------------------------------------------------------- pure planning
def _inside(child: str, parent: str) -> bool:
    child, parent = child.rstrip("/") or "/", parent.rstrip("/") or "/"
    return parent == "/" or child == parent or child.startswith(parent + "/")


def _overlaps(a: str, b: str) -> bool:
    return _inside(a, b) or _inside(b, a)


def validate_inputs(root: str, required_bytes, headroom_bytes=0, headroom_percent=0.0,
                    protected=(), realpath=os.path.realpath) -> None:
    if isinstance(required_bytes, bool) or not isinstance(required_bytes, int):
        raise DiskPlanError(f"required bytes must be an integer number of bytes, got {required_bytes!r}")
    if required_bytes < 0:
        raise DiskPlanError(f"required bytes must be >= 0, got {required_bytes}")
    if isinstance(headroom_bytes, bool) or not isinstance(headroom_bytes, int) or headroom_bytes < 0:
        raise DiskPlanError(f"headroom bytes must be a non-negative integer, got {headroom_bytes!r}")
    if not isinstance(headroom_percent, (int, float)) or not 0 <= headroom_percent < 100:
        raise DiskPlanError(f"headroom percent must be in [0, 100), got {headroom_percent!r}")
    rroot = realpath(root)
    for p in protected:
        if not _inside(realpath(p), rroot):
            raise DiskPlanError(f"protected path {p} is outside the models root {root}; "
                                "protect paths under the root only (outside it nothing is ever deleted anyway)")


def plan_disk(*, root: str, free_bytes: int, total_bytes: int, required_bytes: int, candidates: list[dict],
              headroom_bytes: int = 0, headroom_percent: float = 0.0, explicit: tuple = (), protected: tuple = (),
              in_use: tuple = (), deploying: tuple = (), present_bytes: int = 0, defer_explicit: bool = True,
              realpath=os.path.realpath) -> dict:
    """The deletion plan. Pure given `realpath` (injectable so tests can model symlinks).

    need = required + headroom - present (bytes of the target already on disk, by blocks held)
    shortfall = max(0, need - free)
    delete = the shortest prefix of [explicit..., then least-recently-used...] whose freed bytes cover the
    shortfall; explicit entries not needed now go to `delete_after_verify` (removed only after the new
    model has been verified and served), when defer_explicit is true.
    """
    validate_inputs(root, required_bytes, headroom_bytes, headroom_percent, protected, realpath)
    rroot = realpath(root)
    headroom = max(headroom_bytes, int(total_bytes * headroom_percent / 100))
    need = max(0, required_bytes + headroom - max(0, present_bytes))
    shortfall = max(0, need - free_bytes)
    refused: list[dict] = []
    guards = [("protected", [realpath(p) for p in protected]),
              ("in use by an active unit", [realpath(p) for p in in_use]),
              ("the model being deployed", [realpath(p) for p in deploying])]

    def why_not(c: dict) -> str | None:
        rp = c.get("resolved") or realpath(c["path"])
        if c.get("symlink"):
            return "a symlink (only real directories are deleted)"
        if not _inside(rp, rroot):
            return f"outside the models root (resolves to {rp})"
        if rp == rroot:
            return "the models root itself"
        for label, paths in guards:
            if any(_overlaps(rp, g) for g in paths):
                return label
        return None

    by_path = {c["path"]: c for c in candidates}
    order: list[dict] = []
    for e in explicit:
        c = by_path.get(e)
        if c is None:
            rp = realpath(e)
            c = next((x for x in candidates if (x.get("resolved") or realpath(x["path"])) == rp), None)
        if c is None:
            refused.append({"path": e, "reason": "not a model directory under the root"})
            continue
        if c not in order:
            order.append({**c, "explicit": True})
    explicit_paths = {c["path"] for c in order}
    for c in sorted(candidates, key=lambda x: (x.get("last_used", 0.0), x["path"])):
        if c["path"] not in explicit_paths:
            order.append({**c, "explicit": False})
    allowed = []
    for c in order:
        reason = why_not(c)
        if reason:
            refused.append({"path": c["path"], "reason": reason})
        else:
            allowed.append(c)
    delete, freed = [], 0
    for c in allowed:
        if freed >= shortfall:
            break
        b = c.get("exclusive_allocated_bytes", c.get("allocated_bytes", 0))
        delete.append({"path": c["path"], "bytes": b, "explicit": c["explicit"], "last_used": c.get("last_used"),
                       "complete": c.get("complete")})
        freed += b
    feasible = freed >= shortfall
    deleting = {d["path"] for d in delete}
    later = [{"path": c["path"], "bytes": c.get("exclusive_allocated_bytes", c.get("allocated_bytes", 0))}
             for c in allowed if c["explicit"] and c["path"] not in deleting] if defer_explicit else []
    free_after = free_bytes + (freed if feasible else 0)
    to_write = max(0, required_bytes - max(0, present_bytes))
    free_after_fetch = free_after - to_write if feasible else None
    free_after_cleanup = free_after_fetch + sum(x["bytes"] for x in later) if feasible else None
    out = {
        "root": root,
        "free_bytes": free_bytes,
        "total_bytes": total_bytes,
        "required_bytes": required_bytes,
        "present_bytes": present_bytes,
        "headroom_bytes": headroom,
        "need_bytes": need,
        "shortfall_bytes": shortfall,
        "delete": delete if feasible else [],
        "would_delete_if_feasible": delete if not feasible else [],
        "delete_bytes": freed if feasible else 0,
        "delete_after_verify": later,
        "refused": refused,
        "feasible": feasible,
        "free_after_delete_bytes": free_after,
        "free_after_fetch_bytes": free_after_fetch,
        "free_after_verify_cleanup_bytes": free_after_cleanup,
        "figures": {k: both_units(v) for k, v in (("free", free_bytes), ("required", required_bytes),
                                                    ("headroom", headroom), ("shortfall", shortfall),
                                                    ("free_after_delete", free_after),
                                                    ("free_after_fetch", free_after_fetch),
                                                    ("free_after_verify_cleanup", free_after_cleanup))
                    if v is not None},
    }
    out["summary"] = (f"free {fmt_bytes(free_bytes)}; need {fmt_bytes(need)} (required {fmt_bytes(required_bytes)}"
                      f" + headroom {fmt_bytes(headroom)} - present {fmt_bytes(max(0, present_bytes))}); "
                      f"shortfall {fmt_bytes(shortfall)}")
    if not feasible:
        out["message"] = (f"cannot make room: need {fmt_bytes(need)} (required {fmt_bytes(required_bytes)} + "
                          f"headroom {fmt_bytes(headroom)} - present {fmt_bytes(present_bytes)}), free "
                          f"{fmt_bytes(free_bytes)}, and every allowed deletion together frees only {fmt_bytes(freed)};"
                          f" {len(refused)} candidate(s) refused (see 'refused')")
    elif delete:
        out["message"] = (f"delete {len(delete)} model dir(s) freeing {fmt_bytes(freed)} to cover a shortfall of "
                          f"{fmt_bytes(shortfall)}; free after: {fmt_bytes(free_after)}")
    else:
        out["message"] = (f"no deletion needed: free {fmt_bytes(free_bytes)} covers need {fmt_bytes(need)}"
                          + (f"; {len(later)} explicit deletion(s) deferred until the new model is verified"
                             if later else ""))
    return out


# --------------------------------------------------------------------------- what active units serve
def model_dirs_of_active_units(run=subprocess.run) -> list[dict]:
    """Model directories named by active systemd services that run vLLM: `--model DIR` or
    `vllm serve DIR` in their ExecStart. Read from the host, not from variables."""
    r = run(["systemctl", "list-units", "--type=service", "--state=active", "--no-legend", "--plain"],
            capture_output=True, text=True)
    if r.returncode != 0:
        return []
    found = []
    for line in r.stdout.splitlines():
        unit = line.split()[0] if line.split() else ""
        if not unit.endswith(".service"):
            continue
        s = run(["systemctl", "show", "-p", "ExecStart", "--value", unit], capture_output=True, text=True)
        model = model_from_exec_start(s.stdout)
        if model:
            found.append({"unit": unit, "model": model})
    return found


def model_from_exec_start(exec_start: str) -> str | None:
    """The model directory in a systemd ExecStart property value (`{ path=... ; argv[]=... ; ... }`)."""
    text = exec_start
    if "argv[]=" in text:
        text = text.split("argv[]=", 1)[1].split(" ;", 1)[0]
    argv = text.split()
    if not any("vllm" in a for a in argv):
        return None
    for i, a in enumerate(argv):
        if a == "--model" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--model="):
            return a.split("=", 1)[1]
        if a == "serve" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


# --------------------------------------------------------------------------- applying a plan
class HostLock:
    """A host-wide advisory lock (flock) on a file, so two runs cannot plan and delete at once.
    Non-blocking by default: a second run fails at once naming the holder rather than waiting."""

    def __init__(self, path: str, owner: str = "", wait_seconds: float = 0.0):
        self.path, self.owner, self.wait = path, owner, wait_seconds
        self.fd = None

    def __enter__(self):
        self.fd, holder = flock.try_lock(self.path, wait_seconds=self.wait)
        if self.fd is None:
            raise DiskPlanError(f"another modelfleet run holds the storage lock {self.path} ({holder}); "
                                "wait for it to finish")
        flock.write_holder(self.fd, f"pid={os.getpid()} {self.owner}")
        return self

    def __exit__(self, *exc):
        flock.release(self.fd, clear=True)
        self.fd = None


def delete_model_dir(root: str, path: str, realpath=os.path.realpath) -> int:
    """Remove one model directory safely: re-check it is a real directory strictly inside the root,
    drop its completion marker first (so a crash never leaves something that looks complete), move it
    to <root>/.trash-* atomically (same filesystem), then remove it. Returns bytes freed (blocks)."""
    import time

    rroot, rp = realpath(root), realpath(path)
    if os.path.islink(path) or not os.path.isdir(path):
        raise DiskPlanError(f"{path}: not a real directory; refusing to delete")
    if not _inside(rp, rroot) or rp == rroot:
        raise DiskPlanError(f"{path}: resolves to {rp}, not strictly inside {rroot}; refusing to delete")
    freed = dir_usage(rp)["exclusive_allocated_bytes"]
    marker = os.path.join(rp, MARKER_DIR, COMPLETE)
    if os.path.exists(marker):
        os.unlink(marker)
    trash = os.path.join(rroot, f".trash-{os.path.basename(rp)}-{int(time.time() * 1000)}")
    os.rename(rp, trash)
    shutil.rmtree(trash)
    parent = os.path.dirname(rp)
    if parent != rroot and _inside(parent, rroot) and not os.listdir(parent):
        os.rmdir(parent)  # an <org>--<name> folder left empty
    return freed


def purge_trash(root: str) -> list[str]:
    """Finish deletions a crash interrupted (leftover .trash-* dirs)."""
    done = []
    for e in os.listdir(root):
        t = os.path.join(root, e)
        if e.startswith(".trash-") and os.path.isdir(t) and not os.path.islink(t):
            shutil.rmtree(t)
            done.append(e)
    return done
