"""Disk arithmetic for the models root: what an unprivileged writer can really use, what each model
directory really frees, and which deletions (if any) cover a shortfall - never touching a path outside
the root, the root itself, a protected path, a model an active unit serves, or the model being deployed.

`plan_disk` is pure (values in, plan out). The measuring helpers (`measure_fs`, `dir_usage`,
`list_model_dirs`) only read the filesystem; nothing in this module deletes anything."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import flock
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import DiskPlanError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import both_units, fmt_bytes

MARKER_DIR = ".modelfleet"
LAST_USED = "last_used"      # touched by hf_fetch (and vllm_service on start): the LRU clock
COMPLETE = "complete"


# --------------------------------------------------------------------------- measuring (read-only)
def _zfs_dataset(path: str, mounts: str = "/proc/self/mounts", which=shutil.which) -> str | None:
    """The ZFS dataset holding `path`: the mount that holds it (the longest mount point holding it, the
    later of two on the same point) when that mount is ZFS and the zfs tool is present; None otherwise (an
    ext4 data disk under a root on ZFS is not ZFS)."""
    if not which("zfs"):
        return None
    best = None
    try:
        with open(mounts) as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                dev, mnt, fstype = fields[0], fields[1].replace("\\040", " "), fields[2]
                if path == mnt or path.startswith(mnt.rstrip("/") + "/"):
                    if best is None or len(mnt) >= len(best[1]):  # a later mount on the same point hides it
                        best = (dev, mnt, fstype)
    except OSError:
        return None
    return best[0] if best and best[2] == "zfs" else None


def measure_fs(path: str, run=subprocess.run, mounts: str = "/proc/self/mounts", which=shutil.which) -> dict:
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
    ds = _zfs_dataset(os.path.realpath(path), mounts, which)
    if ds:
        r = run(["zfs", "get", "-Hp", "-o", "value", "available,used", ds], capture_output=True, text=True, check=False)
        if r.returncode == 0:
            avail, used = (int(x) for x in r.stdout.split())
            out.update(free_bytes=avail, total_bytes=avail + used, source=f"zfs dataset {ds} 'available'")
    return out


def dir_usage(path: str) -> dict:
    """Allocated (blocks held) and apparent bytes of a directory tree, symlinks not followed, each inode
    counted once. `exclusive_allocated_bytes` counts only inodes with no links outside this tree's
    count (what deleting the tree really frees; folders, which cannot be hard-linked, always count)."""
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
    exclusive = sum(st.st_blocks * 512 for st, n in seen.values() if stat.S_ISDIR(st.st_mode) or st.st_nlink <= n)
    try:
        top = os.lstat(path).st_blocks * 512
    except OSError:
        top = 0
    allocated += top
    exclusive += top
    return {"apparent_bytes": apparent, "allocated_bytes": allocated, "exclusive_allocated_bytes": exclusive}


def _last_used(path: str) -> float:
    for p in (os.path.join(path, MARKER_DIR, LAST_USED), os.path.join(path, MARKER_DIR, COMPLETE), path):
        try:
            return os.stat(p).st_mtime
        except OSError:
            continue
    return 0.0


# System folders that are never a models root (their subfolders may be, e.g. /var/lib/models, /mnt/models).
SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
                         "/lost+found", "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv",
                         "/sys", "/tmp", "/usr", "/usr/local", "/usr/lib", "/usr/share", "/var", "/var/lib",
                         "/var/cache", "/var/log", "/var/tmp", "/var/spool", "/var/mail", "/boot/efi"})
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".msgpack", ".h5", ".onnx", ".nemo")
HEX40_LEN = 40


def models_root_problem(root, resolve: bool) -> str | None:
    """What is wrong with a models root, as a phrase with its fix, or None when it is acceptable. Refused:
    empty, relative, '..' anywhere, '/' and system folders (also after resolving symlinks, when `resolve`: on
    the host; a controller checking a fleet file checks the spelling only)."""
    if not isinstance(root, str) or not root.strip():
        return "empty; set it to the absolute folder that holds the models (e.g. /models)"
    if any(c in root for c in "\n\r\0"):
        return f"{root!r} contains a control character; give a plain absolute path"
    if not root.startswith("/"):
        return f"{root!r} is relative; give an absolute path (e.g. /models)"
    if ".." in root.split("/"):
        return f"{root!r} contains '..'; give the folder's own absolute path"
    norm = _root_spelling(root)
    real = os.path.realpath(norm) if resolve else norm
    for p in (norm, real):
        if p in SYSTEM_DIRS:
            return (f"{root!r} is {'/' if p == '/' else 'the system folder ' + p}"
                    f"{'' if p == norm else ' (after resolving symlinks)'}; models are never planned "
                    "or deleted there - use a folder of their own such as /models")
    return None


def _root_spelling(root: str) -> str:
    norm = os.path.normpath(root)
    return "/" + norm.lstrip("/")  # normpath keeps a leading "//" (POSIX leaves its meaning open): one "/"


def check_models_root(root, field: str = "models root", resolve: bool = True) -> str:
    """The models root as it will be used (resolved), or a DiskPlanError "<field>: <problem and fix>"
    (models_root_problem)."""
    problem = models_root_problem(root, resolve)
    if problem:
        raise DiskPlanError(f"{field}: {problem}")
    norm = _root_spelling(root)
    return os.path.realpath(norm) if resolve else norm


def model_evidence(path: str, name: str | None = None) -> str | None:
    """Why `path` is a model folder, or None. A model is: a folder with modelfleet's marker
    (.modelfleet/lock.json or complete), a checkpoint (a config.json file and at least one weight file at its
    top level), or the hub cache's models--org--name folder with a snapshots/<rev> that is a checkpoint.
    Only regular files, directories and symlinks are looked at (a FIFO or device is never opened). `name` is
    the folder's own name when `path` does not end with it (a /proc/self/fd/N path)."""
    def isfile(p):
        try:
            return stat.S_ISREG(os.stat(p).st_mode)
        except OSError:
            return False

    if os.path.isfile(os.path.join(path, MARKER_DIR, "lock.json")) or os.path.isfile(
            os.path.join(path, MARKER_DIR, COMPLETE)):
        return "modelfleet marker"
    try:
        names = os.listdir(path)
    except OSError:
        return None
    if "config.json" in names and isfile(os.path.join(path, "config.json")):
        weights = [n for n in names if n.endswith(WEIGHT_SUFFIXES) and isfile(os.path.join(path, n))]
        if weights:
            return f"checkpoint (config.json + {len(weights)} weight file(s))"
    if (name or os.path.basename(path.rstrip("/"))).startswith("models--") and "snapshots" in names:
        snaps = os.path.join(path, "snapshots")
        try:
            revs = [r for r in os.listdir(snaps) if os.path.isdir(os.path.join(snaps, r))]
        except OSError:
            revs = []
        for r in sorted(revs):
            if model_evidence(os.path.join(snaps, r)):
                return f"hub cache layout (snapshots/{r})"
    return None


def _entry(path: str, evidence: str | None) -> dict:
    try:
        st = os.lstat(path)
        ident = {"dev": st.st_dev, "ino": st.st_ino}
    except OSError:
        ident = {}
    if evidence is None:
        return {"path": path, "resolved": os.path.realpath(path), "symlink": os.path.islink(path), "model": False,
                "evidence": None, "allocated_bytes": 0, "apparent_bytes": 0, "exclusive_allocated_bytes": 0,
                "last_used": 0.0, **ident}
    return {"path": path, "resolved": os.path.realpath(path), "symlink": os.path.islink(path), "model": True,
            "evidence": evidence, "last_used": _last_used(path),
            "complete": os.path.exists(os.path.join(path, MARKER_DIR, COMPLETE)), **dir_usage(path), **ident}


def list_model_dirs(root: str) -> list[dict]:
    """Everything under the models root that a plan could name, each with `model` true only when it is
    recognisably a model (model_evidence): `<root>/<org>--<name>/<40-hex revision>` folders of modelfleet's
    layout, hub-cache `models--org--name` folders, and top-level folders that are checkpoints. Every other
    top-level entry is listed with model: false and is never deleted, even when named. Symlinks are listed
    (never deleted). Hidden entries (.staging, .status, .trash-*) are modelfleet's own and not listed."""
    out = []
    for entry in sorted(os.listdir(root)):
        if entry.startswith("."):
            continue
        p = os.path.join(root, entry)
        if os.path.islink(p):
            out.append(_entry(p, None))
            continue
        if not os.path.isdir(p):
            continue
        if "--" in entry and not entry.startswith("models--"):
            subs = sorted(s for s in os.listdir(p) if len(s) == HEX40_LEN and os.path.isdir(os.path.join(p, s))
                          and not os.path.islink(os.path.join(p, s)))
            if subs:
                out.extend(_entry(os.path.join(p, s), model_evidence(os.path.join(p, s))) for s in subs)
                continue
        out.append(_entry(p, model_evidence(p)))
    return out


# --------------------------------------------------------------------------- pure planning
def _inside(child: str, parent: str) -> bool:
    child, parent = child.rstrip("/") or "/", parent.rstrip("/") or "/"
    return parent == "/" or child == parent or child.startswith(parent + "/")


def _overlaps(a: str, b: str) -> bool:
    return _inside(a, b) or _inside(b, a)


def validate_inputs(root: str, required_bytes, headroom_bytes, headroom_percent, protected, realpath) -> None:
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
              keep_until_verified: tuple = (), realpath=os.path.realpath) -> dict:
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
    keep = [realpath(p) for p in keep_until_verified]
    guards = [("protected", [realpath(p) for p in protected]),
              ("in use by a live unit or a running process", [realpath(p) for p in in_use]),
              ("the model being deployed", [realpath(p) for p in deploying])]

    def why_not(c: dict) -> str | None:
        rp = c.get("resolved") or realpath(c["path"])
        if c.get("symlink"):
            return "a symlink (only real directories are deleted)"
        if c.get("model") is not True:
            return ("not a model, never deleted (no modelfleet marker, no config.json with weight files, "
                    "no hub-cache snapshot)")
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
        if all(o["path"] != c["path"] for o in order):  # named twice (or by two spellings): listed once
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
        if any(_overlaps(c.get("resolved") or realpath(c["path"]), k) for k in keep):
            continue  # a fallback: only deleted after the new model is verified (see plan_host)
        b = c.get("exclusive_allocated_bytes", c.get("allocated_bytes", 0))
        delete.append({"path": c["path"], "bytes": b, "explicit": c["explicit"], "last_used": c.get("last_used"),
                       "complete": c.get("complete"), "dev": c.get("dev"), "ino": c.get("ino")})
        freed += b
    feasible = freed >= shortfall
    deleting = {d["path"] for d in delete}
    later = [{"path": c["path"], "bytes": c.get("exclusive_allocated_bytes", c.get("allocated_bytes", 0)),
              "dev": c.get("dev"), "ino": c.get("ino")}
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
        "figures": {k: both_units(v) for k, v in (
            ("free", free_bytes), ("required", required_bytes), ("headroom", headroom), ("shortfall", shortfall),
            ("free_after_delete", free_after), ("free_after_fetch", free_after_fetch),
            ("free_after_verify_cleanup", free_after_cleanup)) if v is not None},
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


# --------------------------------------------------------------------------- the whole plan on a host
def plan_host(*, root: str, required_bytes, headroom_bytes=0, headroom_percent=0.0, explicit=(), protected=(),
              in_use=(), deploying=(), present_bytes=0, defer_explicit=True, fallback=(), read_units=True,
              run=subprocess.run, proc="/proc") -> dict:
    """Measure, list, find what is in use (failing closed), and plan - the one pipeline behind the CLI's
    plan-disk and the disk_plan and storage_reclaim modules. The root is checked (check_models_root) and its
    resolved path used. Fallbacks are kept whenever deleting other models covers the shortfall; only when
    nothing else does is a plan that deletes a fallback early returned, with `fallback_deleted_early`."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import in_use as in_use_mod

    rroot = check_models_root(root)
    if not os.path.isdir(rroot):
        raise DiskPlanError(f"models root {root}: does not exist or is not a folder; create it (mkdir -p {rroot}) "
                            "or set the right root")
    fs = measure_fs(rroot)
    candidates = list_model_dirs(rroot)
    usage = in_use_mod.in_use(rroot, [c["path"] for c in candidates if c.get("model")], read_units=read_units,
                              run=run, proc=proc)

    # Bytes of the target already on disk (a killed download's staging, a final folder being re-checked): they
    # hold blocks now, so the fetch needs only the rest. Counted by blocks held, at most the model's size.
    present_measured = 0
    for d in deploying:
        if os.path.isdir(d) and not os.path.islink(d):
            present_measured += dir_usage(d)["allocated_bytes"]
    if isinstance(required_bytes, int) and not isinstance(required_bytes, bool):
        present_measured = min(present_measured, required_bytes)
    present_bytes = max(present_bytes, present_measured)
    common = dict(root=rroot, free_bytes=fs["free_bytes"], total_bytes=fs["total_bytes"],
                  required_bytes=required_bytes, candidates=candidates, headroom_bytes=headroom_bytes,
                  headroom_percent=headroom_percent, explicit=tuple(explicit), protected=tuple(protected),
                  in_use=tuple(in_use) + tuple(u["path"] for u in usage["in_use"]),
                  deploying=tuple(deploying), present_bytes=present_bytes, defer_explicit=defer_explicit)
    plan = plan_disk(**common, keep_until_verified=tuple(fallback))
    plan["fallback_deleted_early"] = []
    if fallback and not plan["feasible"]:
        plan = plan_disk(**common)
        keep = [os.path.realpath(f) for f in fallback]
        plan["fallback_deleted_early"] = [d["path"] for d in plan["delete"]
                                          if any(_overlaps(os.path.realpath(d["path"]), k) for k in keep)]
    plan["filesystem"] = fs
    plan["in_use"] = usage["in_use"]
    plan["units_read"] = usage["units_read"]
    plan["not_models"] = [c["path"] for c in candidates if not c.get("model")]
    plan["candidates"] = [c["path"] for c in candidates]
    plan["present_measured_bytes"] = present_measured
    return plan


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


O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _open_dir_nofollow(path: str) -> int:
    """A descriptor of `path` opened one component at a time from '/', no symlink followed at any level."""
    fd = os.open("/", O_DIR)
    try:
        for part in [x for x in path.split("/") if x]:
            nfd = os.open(part, O_DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except OSError:
        os.close(fd)
        raise
    return fd


def delete_model_dir(root: str, path: str, expect: tuple[int, int] | None = None) -> int:
    """Remove one model folder without following a symlink at any level and only if it is still the folder
    that was planned: the root is opened component by component with O_NOFOLLOW, then each folder down to
    the target; the target's (device, inode) must equal `expect` (from the plan) and be a model
    (model_evidence); its completion marker goes first (a crash never leaves something that looks
    complete), then it is renamed, relative to those descriptors, to <root>/.trash-* and removed with the
    descriptor-based rmtree. A swapped parent or target fails with nothing deleted. Returns bytes freed."""
    import time

    rroot = os.path.normpath(root)  # the root as planned (resolved then): not resolved again, opened without links
    rel = os.path.relpath(os.path.normpath(path), rroot)
    if os.path.isabs(rel) or rel == "." or rel.split("/")[0] == "..":
        raise DiskPlanError(f"{path}: not strictly inside the models root {root}; refusing to delete")
    parts = rel.split("/")
    try:
        root_fd = _open_dir_nofollow(rroot)
    except OSError as e:
        raise DiskPlanError(f"models root {root}: cannot be opened without following a symlink ({e}); "
                            "nothing deleted") from None
    fds = [root_fd]
    try:
        try:
            for part in parts:
                fds.append(os.open(part, O_DIR, dir_fd=fds[-1]))
        except OSError as e:
            raise DiskPlanError(f"{path}: not a real folder reachable from the root without symlinks ({e.strerror});"
                                " refusing to delete") from None
        st = os.fstat(fds[-1])
        if expect is not None and (st.st_dev, st.st_ino) != tuple(expect):
            raise DiskPlanError(f"{path}: changed since it was planned (device/inode {st.st_dev}/{st.st_ino}, "
                                f"planned {expect[0]}/{expect[1]}); refusing to delete - plan again")
        here = f"/proc/self/fd/{fds[-1]}"  # the folder that was opened, whatever its name now points to
        if not model_evidence(here, name=parts[-1]):
            raise DiskPlanError(f"{path}: not a model (no marker, no config.json with weights); refusing to delete")
        freed = dir_usage(here)["exclusive_allocated_bytes"]
        try:
            mfd = os.open(MARKER_DIR, O_DIR, dir_fd=fds[-1])
            try:
                os.unlink(COMPLETE, dir_fd=mfd)
            except FileNotFoundError:
                pass
            finally:
                os.close(mfd)
        except (FileNotFoundError, NotADirectoryError):
            pass
        trash = f".trash-{parts[-1]}-{int(time.time() * 1000)}"
        os.rename(parts[-1], trash, src_dir_fd=fds[-2], dst_dir_fd=root_fd)
        moved = os.stat(trash, dir_fd=root_fd, follow_symlinks=False)
        if (moved.st_dev, moved.st_ino) != (st.st_dev, st.st_ino):  # cannot happen short of a kernel bug
            raise DiskPlanError(f"{path}: the renamed entry is not the checked folder; left at {rroot}/{trash}")
        shutil.rmtree(trash, dir_fd=root_fd)
        if len(parts) > 1:
            try:
                os.rmdir(parts[-2], dir_fd=fds[-3])  # an <org>--<name> folder left empty
            except OSError:
                pass
        return freed
    finally:
        for fd in reversed(fds):
            os.close(fd)


def purge_trash(root: str) -> list[str]:
    """Finish deletions a crash interrupted (leftover .trash-* dirs)."""
    done = []
    for e in os.listdir(root):
        t = os.path.join(root, e)
        if e.startswith(".trash-") and os.path.isdir(t) and not os.path.islink(t):
            shutil.rmtree(t)
            done.append(e)
    return done
