"""Fetching a model: pinned, locked, verified, resumable, with progress a poller can read.

Layout on a host (see README "State layout"):
  <root>/<org>--<name>/<commit>/                 the model as served (immutable once complete)
  <root>/<org>--<name>/<commit>/.modelfleet/     lock.json, complete (written last), last_used
  <root>/.staging/<org>--<name>/<commit>/        a download in flight (huggingface_hub local_dir)
  <root>/.status/<org>--<name>@<commit>.json     progress: state, bytes done/total, rate, ETA, stalls
  <root>/.status/<org>--<name>@<commit>.lock     held (flock) by the one fetch writing this model; pid inside

The pure parts (paths, lock building, file selection, hashing, progress arithmetic) are plain functions;
`download_with_watchdog` and `finalize` do the I/O."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import time

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import flock
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError

HEX40 = re.compile(r"^[0-9a-f]{40}\Z")
MARKER_DIR = ".modelfleet"


class FetchError(ModelfleetError):
    """A fetch could not complete; nothing incomplete is presented as complete."""


# --------------------------------------------------------------------------- paths and lock
def repo_dir_name(repo_id: str) -> str:
    org, _dummy, name = repo_id.partition("/")
    if not org or not name or "/" in name or ".." in repo_id:
        raise FetchError(f"repo id {repo_id!r} is not of the form org/name")
    return f"{org}--{name}"


def owner_ids(owner: str, group: str) -> tuple[int, int]:
    """(uid, gid) for the owner and group the final files get; a name the host does not know is a FetchError."""
    import grp
    import pwd

    try:
        return pwd.getpwnam(owner).pw_uid, grp.getgrnam(group).gr_gid
    except KeyError as e:
        raise FetchError(f"owner/group {e} does not exist on the host") from None


def model_paths(root: str, repo_id: str, commit: str) -> dict:
    if not HEX40.match(commit or ""):
        raise FetchError(f"revision {commit!r} is not a 40-hex commit; resolve it first")
    d = repo_dir_name(repo_id)
    return {
        "final": os.path.join(root, d, commit),
        "staging": os.path.join(root, ".staging", d, commit),
        "status": os.path.join(root, ".status", f"{d}@{commit}.json"),
        # the one-writer flock file (ModelWriteLock); the file manifest is the lock (hf_lock, .modelfleet/lock.json)
        "flock": os.path.join(root, ".status", f"{d}@{commit}.flock"),
        "meta": os.path.join(root, d, commit, MARKER_DIR),
    }


def select_files(names: list[str], allow_patterns: list[str] | None) -> list[str]:
    if not allow_patterns:
        return sorted(names)
    return sorted(n for n in names if any(fnmatch.fnmatch(n, p) for p in allow_patterns))


def hub_listing(repo_id: str, revision: str, endpoint: str | None, token: str | None) -> tuple[str, list[dict]]:
    """Resolve `revision` to its commit and list every file with size, sha256 (LFS) and git blob id,
    through huggingface_hub. Errors are FetchError with the repo, revision and what to do."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.checkpoint import transport_errors
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        HfHubHTTPError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    api = HfApi(endpoint=endpoint, token=token)
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
        files = {s.rfilename: {"name": s.rfilename, "size": s.size,
                               "sha256": s.lfs.sha256 if s.lfs else None, "blob_id": s.blob_id}
                 for s in (info.siblings or [])}
        if any(f["size"] is None or f["blob_id"] is None for f in files.values()):
            for p in api.get_paths_info(repo_id, sorted(files), revision=info.sha):
                f = files.get(p.path)
                if f is None:
                    continue
                f["size"] = p.size
                f["blob_id"] = getattr(p, "blob_id", None)
                lfs = getattr(p, "lfs", None)
                if lfs is not None:
                    f["sha256"] = getattr(lfs, "sha256", None) or (lfs.get("sha256") if isinstance(lfs, dict) else None)
    except HFValidationError as e:
        raise FetchError(f"{repo_id}: not a valid repo id ({str(e).splitlines()[0]})") from None
    except RevisionNotFoundError:
        raise FetchError(f"{repo_id}: revision {revision!r} not found on the hub; check the profile's revision") \
            from None
    except RepositoryNotFoundError:
        raise FetchError(f"{repo_id}: repository not found (or not visible with this token); check repo_id") from None
    except HfHubHTTPError as e:
        code = e.response.status_code if e.response is not None else "?"
        raise FetchError(f"{repo_id}@{revision}: hub answered HTTP {code}; retry later or check the endpoint") from None
    except transport_errors() as e:
        raise FetchError(f"{repo_id}: cannot reach the hub at {endpoint or 'the default endpoint'} ({e}); "
                         "check HF_ENDPOINT / hf_fetch_endpoint and the network") from None
    if not info.sha or not HEX40.match(info.sha):
        raise FetchError(f"{repo_id}@{revision}: the hub did not resolve the revision to a commit")
    return info.sha, sorted(files.values(), key=lambda f: f["name"])


def build_lock(repo_id: str, requested: str, commit: str, files: list[dict], allow_patterns, endpoint) -> dict:
    chosen = set(select_files([f["name"] for f in files], allow_patterns))
    entries = [f for f in files if f["name"] in chosen]
    if not entries:
        raise FetchError(f"{repo_id}@{commit[:12]}: allow_patterns {allow_patterns} match no file")
    for f in entries:
        if f.get("size") is None:
            raise FetchError(f"{repo_id}@{commit[:12]}: the hub gave no size for {f['name']}; cannot verify it")
        if not f.get("sha256") and not f.get("blob_id"):
            raise FetchError(f"{repo_id}@{commit[:12]}: the hub gave no checksum for {f['name']}")
    return {
        "format": 1,
        "repo_id": repo_id,
        "requested_revision": requested,
        "revision": commit,
        "source": {"endpoint": endpoint or "default"},
        "allow_patterns": list(allow_patterns or []),
        "total_bytes": sum(f["size"] for f in entries),
        "files": [{"name": f["name"], "size": f["size"], "sha256": f.get("sha256"), "blob_id": f.get("blob_id")}
                  for f in entries],
    }


# --------------------------------------------------------------------------- verification
def file_digest(path: str, algo: str, buf: int = 8 << 20) -> tuple[str, int]:
    """Hex digest of a file; 'git-sha1' is git's blob id (sha1 of 'blob <size>\\0' + content)."""
    size = os.path.getsize(path)
    h = hashlib.sha1(f"blob {size}\0".encode()) if algo == "git-sha1" else hashlib.new(algo)
    n = 0
    with open(path, "rb", buffering=0) as f:
        mv = memoryview(bytearray(buf))
        while True:
            k = f.readinto(mv)
            if not k:
                break
            h.update(mv[:k])
            n += k
    return h.hexdigest(), n


def entry_digest(entry: dict) -> tuple[str, str]:
    """The digest a lock entry is checked by: (algo, hex) - sha256 for LFS files, the git blob id for the others."""
    return ("sha256", entry["sha256"]) if entry.get("sha256") else ("git-sha1", entry["blob_id"])


def verify_entry(base: str, entry: dict) -> dict:
    """Check one file against its lock entry: size, then sha256 (LFS files) or the git blob id."""
    path = os.path.join(base, entry["name"])
    if not os.path.isfile(path) or os.path.islink(path):
        return {"name": entry["name"], "ok": False, "reason": "missing", "bytes": 0}
    size = os.path.getsize(path)
    if size != entry["size"]:
        return {"name": entry["name"], "ok": False, "bytes": 0,
                "reason": f"size {size} != expected {entry['size']}"}
    algo, want = entry_digest(entry)
    got, n = file_digest(path, algo)
    if got != want:
        return {"name": entry["name"], "ok": False, "bytes": n, "reason": f"{algo} {got} != expected {want}"}
    return {"name": entry["name"], "ok": True, "bytes": n, "reason": ""}


def verify_tree(base: str, lock: dict) -> dict:
    t = time.monotonic()
    results = [verify_entry(base, e) for e in lock["files"]]
    dt = max(time.monotonic() - t, 1e-9)
    hashed = sum(r["bytes"] for r in results)
    return {"ok": all(r["ok"] for r in results), "bad": [r for r in results if not r["ok"]],
            "bytes_hashed": hashed, "seconds": dt, "mb_per_s": hashed / dt / 1e6}


# --------------------------------------------------------------------------- progress
def tree_bytes(path: str) -> int:
    """Bytes on disk under `path` (apparent sizes of files, incomplete downloads included)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def progress_figures(samples: list[tuple[float, int]], total: int, window: float = 10.0) -> dict:
    """Rate over the last `window` seconds of (time, bytes) samples, and the ETA it gives."""
    if not samples:
        return {"bytes_done": 0, "bytes_total": total, "rate_bytes_per_s": 0.0, "eta_s": None, "percent": 0.0}
    t1, b1 = samples[-1]
    old = [s for s in samples if s[0] >= t1 - window] or samples[-1:]
    t0, b0 = old[0]
    rate = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
    left = max(total - b1, 0)
    return {"bytes_done": b1, "bytes_total": total, "rate_bytes_per_s": round(rate, 1),
            "eta_s": round(left / rate, 1) if rate > 0 else None,
            "percent": round(100.0 * b1 / total, 2) if total else 100.0}


def write_status(path: str, status: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(status, f, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


class ModelWriteLock:
    """One writer per model: an exclusive flock on <root>/.status/<model>@<commit>.lock, held while a fetch
    or a re-verification changes staging or the final tree. The kernel drops it when the holder dies (a
    killed fetch leaves no stale lock); the download child inherits it, so it stays held while that child
    still writes. A second writer is refused within flock.PROBE_TOLERANCE (2 s) with the holder's pid and
    progress, never waits longer, and changes nothing. The role's watch asks whether the writer it started still
    holds it (module fetch_watch): a job whose writer is gone fails then, instead of waiting its whole timeout."""

    def __init__(self, paths: dict):
        self.paths = paths
        self.fd = None

    def __enter__(self):
        return self.acquire()

    def acquire(self):
        """Take the lock (released at __exit__, or when this process and its children end)."""
        # a watch probing whether a writer still holds it (flock.holder) holds it for an instant: wait that out
        fd, holder = flock.try_lock(self.paths["flock"], wait_seconds=flock.PROBE_TOLERANCE, mode=0o644)
        if fd is None:
            raise FetchError(self.busy_message(holder))
        flock.write_holder(fd, f"{os.getpid()}\n")
        self.fd = fd
        return self

    def busy_message(self, holder: str) -> str:
        try:
            with open(self.paths["status"]) as f:
                st = json.load(f)
            pct = st.get("percent")
            progress = f"{st.get('state', '?')}" + (f", {pct:.1f}%" if isinstance(pct, (int, float)) else "")
        except (OSError, ValueError, TypeError):
            progress = "no progress recorded"
        try:
            os.kill(int(holder), 0)
        except (ValueError, ProcessLookupError):
            holder += f", now gone: a process it started still holds {self.paths['flock']} (fuser -v shows it)"
        except PermissionError:
            pass
        return (f"another fetch (pid {holder}) is writing {self.paths['staging']} ({progress}; progress in "
                f"{self.paths['status']}); wait for it to finish or end that process, then rerun - nothing was "
                "changed")

    def __exit__(self, *exc):
        if self.fd is not None:
            flock.release(self.fd)  # the download child's copy, if it still lives, keeps it held
            self.fd = None
        return False


# --------------------------------------------------------------------------- the hub client's environment
# Against the real hub, huggingface_hub takes the Xet path (the hf_xet package, a dependency of huggingface_hub)
# for Xet-backed files, with a chunk cache under the fetching user's home - outside the models root and the disk
# plan - and a transfer the harness hub never exercises (it serves LFS over plain HTTP). So a fetch runs with Xet
# off unless asked (the hub serves the same files over its classic HTTP path, which the stall watchdog, resume
# and verification are tested on); with Xet on, its chunk cache lives in the staging folder (on the models root,
# removed when the model is complete) with a bounded size that the disk plan counts (required_bytes).
XET_CACHE_DIR = os.path.join(".cache", "xet")


def hub_environment(staging: str, xet: bool = False, xet_cache_bytes: int = 0,
                    xet_high_performance: bool = False) -> dict:
    """The environment variables huggingface_hub and hf_xet get for one fetch into `staging`."""
    env = {"HF_HUB_DISABLE_TELEMETRY": "1"}
    if not xet:
        env["HF_HUB_DISABLE_XET"] = "1"
        return env
    if not isinstance(xet_cache_bytes, int) or isinstance(xet_cache_bytes, bool) or xet_cache_bytes <= 0:
        raise FetchError(f"xet_cache_bytes {xet_cache_bytes!r}: with Xet on, give the chunk cache's size in bytes "
                         "(a positive integer; the disk plan reserves it on the models root)")
    env.update(HF_HUB_DISABLE_XET="0", HF_XET_CACHE=os.path.join(staging, XET_CACHE_DIR),
               HF_XET_CHUNK_CACHE_SIZE_BYTES=str(xet_cache_bytes),
               HF_XET_HIGH_PERFORMANCE="1" if xet_high_performance else "0")
    return env


def apply_hub_environment(env: dict) -> None:
    """Put `env` in this process's environment. huggingface_hub reads these once, when it is first imported, so a
    process that imported it already gets its constants set to the same values."""
    import sys

    os.environ.update(env)
    if env.get("HF_HUB_DISABLE_XET") == "1":
        os.environ.pop("HF_XET_CACHE", None)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_DISABLE_XET = env.get("HF_HUB_DISABLE_XET") == "1"
        constants.HF_XET_HIGH_PERFORMANCE = env.get("HF_XET_HIGH_PERFORMANCE") == "1"
        if "HF_XET_CACHE" in env:
            constants.HF_XET_CACHE = env["HF_XET_CACHE"]


def transfer_facts() -> dict:
    """What the hub client in this process will do, read from huggingface_hub itself after the environment is
    applied: whether the Xet path is open and where its chunk cache goes."""
    from huggingface_hub import constants

    xet = not constants.HF_HUB_DISABLE_XET
    return {"xet": xet, "xet_cache": constants.HF_XET_CACHE if xet else None,
            "xet_chunk_cache_bytes": int(os.environ.get("HF_XET_CHUNK_CACHE_SIZE_BYTES", "0")) if xet else None}


def required_bytes(total_bytes: int, xet: bool = False, xet_cache_bytes: int = 0, from_hub: bool = True) -> int:
    """Bytes a fetch needs free on the models root: the model, plus the Xet chunk cache's bound on a host that
    downloads from the hub with Xet on (the cache lives in the staging folder until the model is complete)."""
    return int(total_bytes) + (int(xet_cache_bytes) if xet and from_hub else 0)


# --------------------------------------------------------------------------- download
def _die_with_parent(parent_pid: int) -> None:
    """Linux: deliver SIGKILL to this process when its parent dies, so a killed fetch leaves no orphan
    download writing into staging. A parent that died before the request was made (killed between fork
    and here) would never send it, so that case ends the child at once."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(70)


def _child_download(repo_id, commit, staging, names, endpoint, token, max_workers, parent_pid):
    os.setsid()
    _die_with_parent(parent_pid)
    os.environ.pop("HF_TOKEN", None)
    from huggingface_hub import snapshot_download

    # what this child's hub client will do (Xet or not, where its cache goes), for the status file
    facts = os.path.join(staging, ".cache", "modelfleet-transfer.json")
    os.makedirs(os.path.dirname(facts), exist_ok=True)
    with open(facts, "w") as f:
        json.dump(transfer_facts(), f)

    snapshot_download(repo_id, revision=commit, local_dir=staging, allow_patterns=names, max_workers=max_workers,
                      endpoint=endpoint, token=token or False)


def _read_transfer(staging: str) -> dict:
    try:
        with open(os.path.join(staging, ".cache", "modelfleet-transfer.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def download_with_watchdog(*, repo_id: str, lock: dict, staging: str, status_path: str, endpoint, token,
                           max_workers: int = 8, stall_seconds: float = 60, max_stalls: int = 3,
                           poll_seconds: float = 1.0, log=lambda msg: None) -> dict:
    """Run snapshot_download in a child process; restart it when no new bytes arrive for
    `stall_seconds`; fail after `max_stalls` restarts. Completed files survive restarts (huggingface_hub
    keeps them in local_dir); a partial file is re-fetched whole (at most max_workers of them)."""
    import multiprocessing as mp

    import huggingface_hub  # noqa: F401  - imported once here, so each forked attempt starts at once

    ctx = mp.get_context("fork")
    names = [f["name"] for f in lock["files"]]
    total = sum(f["size"] for f in lock["files"])
    stalls = attempts = 0
    samples: list[tuple[float, int]] = []
    started = time.time()
    transfer: dict = {}
    while True:
        attempts += 1
        child = ctx.Process(target=_child_download,
                            args=(repo_id, lock["revision"], staging, names, endpoint, token, max_workers,
                                  os.getpid()))
        child.start()
        write_status(status_path, {"state": "downloading", "repo_id": repo_id, "revision": lock["revision"],
                                   **progress_figures(samples, total), "stalls": stalls, "attempt": attempts,
                                   "pid": child.pid, "watchdog_pid": os.getpid(), "started_at": started,
                                   "updated_at": time.time()})
        last_bytes, last_change = -1, time.monotonic()
        reason = None
        while True:
            child.join(poll_seconds)
            now = time.monotonic()
            done = tree_bytes(staging) - tree_bytes(os.path.join(staging, ".cache"))
            incomplete = tree_bytes(os.path.join(staging, ".cache"))
            seen = done + incomplete
            if seen != last_bytes:
                last_bytes, last_change = seen, now
            samples.append((now, seen))
            samples = samples[-600:]
            fig = progress_figures(samples, total)
            transfer = transfer or _read_transfer(staging)
            write_status(status_path, {"state": "downloading", "repo_id": repo_id, "revision": lock["revision"],
                                       **fig, "transfer": transfer, "stalls": stalls, "attempt": attempts,
                                       "pid": child.pid,
                                       "watchdog_pid": os.getpid(),
                                       "started_at": started, "updated_at": time.time()})
            if not child.is_alive():
                break
            if now - last_change > stall_seconds:
                reason = f"no new bytes for {stall_seconds:g} s at {seen} of {total} bytes"
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.join(10)
                break
        if reason is None and child.exitcode == 0:
            return {"attempts": attempts, "stalls": stalls, "seconds": time.time() - started,
                    "transfer": transfer or _read_transfer(staging)}
        stalls += 1
        why = reason or f"download process exited with code {child.exitcode}"
        log(f"attempt {attempts}: {why}")
        if stalls > max_stalls:
            write_status(status_path, {"state": "failed", "repo_id": repo_id, "revision": lock["revision"],
                                       **progress_figures(samples, total), "stalls": stalls, "reason": why,
                                       "updated_at": time.time()})
            raise FetchError(f"{repo_id}@{lock['revision'][:12]}: transfer stalled or failed {stalls} times "
                             f"(last: {why}); the hub or network is not delivering - check the endpoint, then rerun "
                             "(completed files are kept)")


def prepare_staging(staging: str, lock: dict) -> dict:
    """Check what a previous, interrupted attempt left in staging: files of the right size and checksum
    are kept (and not fetched again); anything else there is removed. Returns the lock entries still
    to fetch and the verification figures of what was kept."""
    keep, todo, hashed, t = [], [], 0, time.monotonic()
    for e in lock["files"]:
        p = os.path.join(staging, e["name"])
        if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) == e["size"]:
            r = verify_entry(staging, e)
            hashed += r["bytes"]
            if r["ok"]:
                keep.append(e["name"])
                continue
        if os.path.lexists(p):
            os.unlink(p)
        meta = os.path.join(staging, ".cache", "huggingface", "download", e["name"] + ".metadata")
        if os.path.exists(meta):
            os.unlink(meta)
        todo.append(e)
    dt = max(time.monotonic() - t, 1e-9)
    return {"kept": keep, "todo": todo, "bytes_hashed": hashed, "mb_per_s": hashed / dt / 1e6}


def reopen_complete(final: str, staging: str, lock: dict, full: bool) -> dict:
    """Re-check a complete model. If a file is wrong (full: sha256; else sizes only), take the tree back
    to staging (completion marker removed first) so only the bad files are fetched again."""
    if full:
        v = verify_tree(final, lock)
    else:
        bad = [{"name": e["name"], "ok": False, "reason": "size"} for e in lock["files"]
               if not os.path.isfile(os.path.join(final, e["name"]))
               or os.path.getsize(os.path.join(final, e["name"])) != e["size"]]
        v = {"ok": not bad, "bad": bad, "bytes_hashed": 0, "seconds": 0, "mb_per_s": 0}
    if v["ok"]:
        return v
    os.unlink(os.path.join(final, MARKER_DIR, "complete"))
    os.makedirs(os.path.dirname(staging), exist_ok=True)
    if os.path.exists(staging):
        shutil.rmtree(staging)
    os.rename(final, staging)
    return v


def refetch_file(repo_id: str, commit: str, staging: str, name: str, endpoint, token) -> None:
    from huggingface_hub import hf_hub_download

    p = os.path.join(staging, name)
    if os.path.exists(p):
        os.unlink(p)
    meta = os.path.join(staging, ".cache", "huggingface", "download", name + ".metadata")
    if os.path.exists(meta):
        os.unlink(meta)
    hf_hub_download(repo_id, name, revision=commit, local_dir=staging, endpoint=endpoint, token=token or False,
                    force_download=True)


def finalize(staging: str, final: str, lock: dict, owner: tuple[int, int] | None = None) -> None:
    """Move a verified staging tree into place and mark it complete (the marker is written last)."""
    shutil.rmtree(os.path.join(staging, ".cache"), ignore_errors=True)
    meta = os.path.join(staging, MARKER_DIR)
    os.makedirs(meta, exist_ok=True)
    with open(os.path.join(meta, "lock.json"), "w") as f:
        json.dump(lock, f, indent=1, sort_keys=True)
    if os.path.exists(final):
        if os.path.exists(os.path.join(final, MARKER_DIR, "complete")):
            raise FetchError(f"{final} is already complete; refusing to replace it")
        trash = f"{final}.incomplete-{int(time.time())}"
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    os.rename(staging, final)
    for dirpath, _dirs, files in os.walk(final):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
        if owner:
            os.chown(dirpath, *owner)
            for f in files:
                os.chown(os.path.join(dirpath, f), *owner)
    open(os.path.join(final, MARKER_DIR, "last_used"), "w").close()
    marker = os.path.join(final, MARKER_DIR, "complete")
    with open(marker, "w") as f:
        f.write(json.dumps({"revision": lock["revision"], "verified_at": time.time()}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def is_complete(final: str, commit: str) -> bool:
    try:
        with open(os.path.join(final, MARKER_DIR, "lock.json")) as f:
            lock = json.load(f)
        return os.path.exists(os.path.join(final, MARKER_DIR, "complete")) and lock.get("revision") == commit
    except (OSError, ValueError):
        return False
