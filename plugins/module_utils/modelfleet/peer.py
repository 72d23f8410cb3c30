"""Peer distribution: hosts that need a model pull it from hosts that have it, never through the controller.

The hosts form a pipelined chain (fanout 1) or a tree (fanout k) rooted at the origin, the one host that holds
the verified model. Each receiver pulls file by file, in the lock's order, from its first live source (its
parent, then the parent's ancestors up to the origin), with rsync over SSH; a source serves only files it has
itself verified against the lock's sha256, so a receiver starts a file as soon as its parent has it (the chain
is pipelined: every link carries one copy at once) and a bad byte is caught at the first host that receives it,
before it is served onwards. A source that stops making progress, fails, or serves a file that does not match
the lock is dropped and the receiver re-attaches to the next one. A killed pull continues from what is already
verified in staging.

What a receiver serves while it pulls: its staging folder's verified files (renamed into staging only after
they matched the lock) and its status file (`<root>/.status/<model>@<commit>.json`, `verified` lists them),
both read over SSH by its children through rrsync (read-only, confined to the models root). The origin serves
its complete final tree.

`plan` is the pure rule; `pull` does the I/O through an `rsync` runner; `finalize_recorded` marks the tree
complete from the digests taken as each file arrived (each file is hashed once on each host)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import (
    MARKER_DIR,
    FetchError,
    entry_digest,
    file_digest,
    finalize,
    model_paths,
    write_status,
)

RECORD = "peer-verified.json"


class PeerError(FetchError):
    """A peer pull cannot go on: no source left, or bad input. Nothing incomplete is marked complete."""


# --------------------------------------------------------------------------- the rule
def plan(origin: str, receivers: list[str], fanout: int = 1) -> dict:
    """For each receiver, its sources in the order it tries them: its parent in the tree built over
    [origin] + receivers (node i's parent is node (i - 1) // fanout), then the parent's ancestors, the origin
    last. fanout 1 is a chain: every host's uplink carries one copy, whatever the fleet's size."""
    if not isinstance(fanout, int) or isinstance(fanout, bool) or fanout < 1:
        raise PeerError(f"peer fanout must be an integer >= 1, got {fanout!r}")
    if not origin:
        raise PeerError("peer distribution needs an origin host that holds the verified model")
    seen = set()
    for r in receivers:
        if r == origin or r in seen:
            raise PeerError(f"host {r!r} appears twice among the origin and the receivers; each host receives once")
        seen.add(r)
    nodes = [origin, *receivers]
    out = {}
    for i in range(1, len(nodes)):
        chain, j = [], i
        while j > 0:
            j = (j - 1) // fanout
            chain.append(nodes[j])
        out[nodes[i]] = chain
    return out


def served_by(sources: dict) -> dict:
    """The inverse of a plan: for each host, the receivers that may pull from it (whose keys it accepts)."""
    out: dict = {}
    for receiver, chain in sources.items():
        for s in chain:
            out.setdefault(s, []).append(receiver)
    return out


def source_entries(names: list[str], reach: dict, user: str, origin: str) -> list[dict]:
    """The hf_peer_pull sources for a receiver: each named host as the others reach it (`reach[name]`: address,
    port, root), the transfer user, and complete for the origin (whose finished tree serves every file)."""
    out = []
    for name in names:
        r = reach.get(name)
        if not isinstance(r, dict) or not r.get("address") or not r.get("root"):
            raise PeerError(f"source host {name!r} has no address and models root to be reached at (it did not "
                            "run the peer set-up: did it fail earlier in this play?)")
        try:
            port = int(r.get("port") or 22)
        except (TypeError, ValueError):
            raise PeerError(f"source host {name!r}: port {r.get('port')!r} is not a number") from None
        out.append({"host": name, "address": str(r["address"]), "port": port, "user": user,
                    "root": str(r["root"]), "complete": name == origin})
    return out


# --------------------------------------------------------------------------- transport
def rsync_command(source: dict, rel: str, dest: str, *, key: str = "", known_hosts: str = "",
                  control_dir: str = "", timeout: int = 60, append: bool = True) -> list[str]:
    """The rsync command that copies `rel` (relative to the source's models root) to `dest`. A source with an
    address is reached over SSH as source['user'] (its authorized key runs rrsync, read-only, confined to the
    models root, so paths are relative to it); without one it is a local folder (source['root'])."""
    args = ["rsync", "--times", f"--timeout={int(timeout)}"]
    if append:
        args.append("--append-verify")  # a partial file from a killed pull is continued, then checked whole
    else:  # a status: copied every time. rsync's quick check skips a file of the same size and the same second, so a
        # status rewritten in the second it was last read (a growing file's heartbeat) would read as unchanged
        args.append("--ignore-times")
    if not source.get("address"):
        return [*args, os.path.join(source["root"], rel), dest]
    ssh = ["ssh", "-p", str(int(source.get("port") or 22)), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
           "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "IdentitiesOnly=yes"]
    if key:
        ssh += ["-i", key]
    if known_hosts:
        ssh += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    if control_dir:  # one SSH connection per source for the many small status reads and the files
        ssh += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/%C", "-o", "ControlPersist=60"]
    return [*args, "-e", shlex.join(ssh), f"{source.get('user') or 'modelfleet-peer'}@{source['address']}:{rel}",
            dest]


def run_rsync(cmd: list[str], timeout: float) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                           check=False)
    except subprocess.TimeoutExpired:
        return 124, f"rsync did not finish in {timeout:g} s"
    return p.returncode, (p.stderr or p.stdout).strip()[-400:]


# --------------------------------------------------------------------------- records
def load_record(staging: str) -> dict:
    try:
        with open(os.path.join(staging, MARKER_DIR, RECORD)) as f:
            rec = json.load(f)
        return rec if isinstance(rec, dict) else {}
    except (OSError, ValueError):
        return {}


def save_record(staging: str, record: dict) -> None:
    d = os.path.join(staging, MARKER_DIR)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f"{RECORD}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, sort_keys=True)
    os.replace(tmp, os.path.join(d, RECORD))


def recorded_ok(staging: str, entry: dict, record: dict) -> bool:
    """The file is in staging exactly as it was when its digest matched the lock (size and mtime unchanged)."""
    r = record.get(entry["name"])
    p = os.path.join(staging, entry["name"])
    if not isinstance(r, dict) or not os.path.isfile(p) or os.path.islink(p):
        return False
    st = os.stat(p)
    algo, want = entry_digest(entry)
    return r.get("algo") == algo and r.get("digest") == want and r.get("size") == st.st_size == entry["size"] \
        and r.get("mtime_ns") == st.st_mtime_ns


def resume(staging: str, lock: dict) -> dict:
    """What a killed pull left: files whose record still holds are kept; every other locked file in staging is
    hashed again (kept when it matches, removed when not), so nothing unverified is ever served onwards."""
    record = load_record(staging)
    keep = {}
    for e in lock["files"]:
        p = os.path.join(staging, e["name"])
        if recorded_ok(staging, e, record):
            keep[e["name"]] = record[e["name"]]
            continue
        if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) == e["size"]:
            algo, want = entry_digest(e)
            got, _n = file_digest(p, algo)
            if got == want:
                st = os.stat(p)
                keep[e["name"]] = {"algo": algo, "digest": got, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
                continue
        if os.path.lexists(p):
            os.unlink(p)
    save_record(staging, keep)
    return keep


# --------------------------------------------------------------------------- the pull
# rsync's exit status when the file it was asked for could not be read (absent, there or through rrsync)
RSYNC_PARTIAL = 23
# consecutive failed reads of a source's status before it is dropped: one lost connection is not a dead host
STATUS_TRIES = 3


def _source_status(src: dict, rel_status: str, scratch: str, rsync, timeout: float) -> dict | None:
    """A source's status: the origin (complete) serves every file; a peer's status file says what it has
    verified. A peer that answers but has no status file yet (its own pull, started in the same task, has not
    begun) is "pending": nothing verified. None when it cannot be read (host down, SSH refused)."""
    if src.get("complete"):
        return {"state": "complete"}
    dest = os.path.join(scratch, f"status-{src['host']}.json")
    rc, _err = rsync(rsync_command(src, rel_status, dest, append=False, **src.get("ssh", {})), timeout)
    if rc == RSYNC_PARTIAL:
        return {"state": "pending", "verified": [], "updated_at": None}
    if rc != 0:
        return None
    try:
        with open(dest) as f:
            st = json.load(f)
        return st if isinstance(st, dict) else None
    except (OSError, ValueError):
        return None


# a socket path is at most 107 bytes: the folder, "/", %C (40 hex digits) and the 17 characters ssh adds while
# it creates the socket
MAX_CONTROL_DIR = 107 - 1 - 40 - 17


def close_connections(sources: list[dict]) -> None:
    """End the shared SSH connection to each source (ControlMaster): none outlives the pull."""
    for src in sources:
        cdir = (src.get("ssh") or {}).get("control_dir")
        if not cdir or not src.get("address"):
            continue
        subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={cdir}/%C", "-p", str(int(src.get("port") or 22)),
                        f"{src.get('user') or 'modelfleet-peer'}@{src['address']}"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=10, check=False)


def pull(*, root: str, lock: dict, sources: list[dict], poll_seconds: float = 1.0,
         stall_seconds: float = 60.0, rsync=run_rsync, log=lambda msg: None, digest=file_digest) -> dict:
    """Pull every locked file (see _pull), then end the SSH connections it opened, whatever happened."""
    try:
        return _pull(root=root, lock=lock, sources=sources, poll_seconds=poll_seconds,
                     stall_seconds=stall_seconds, rsync=rsync, log=log, digest=digest)
    finally:
        close_connections(sources)


def _pull(*, root: str, lock: dict, sources: list[dict], poll_seconds: float = 1.0,
          stall_seconds: float = 60.0, rsync=run_rsync, log=lambda msg: None, digest=file_digest) -> dict:
    """Pull every locked file into this host's staging folder from the first live source, verifying each
    against the lock before it is renamed into staging (and so before this host serves it onwards).
    `sources`: dicts {host, address, port, user, root, complete, ssh: {key, known_hosts, control_dir}}, tried in
    order. Returns figures; raises PeerError when no source is left. Does not mark the model complete
    (`finalize_recorded` does, once every host's pull has ended: children may still read this staging).

    A file is hashed while the next one moves (one hashing thread; at most one received file waits unverified):
    each hop then moves files at the rate of the slower of its link and its hash, not of the two one after the
    other. The hashing thread renames a good file into staging and lists it in the status at once, so children
    do not wait for the transfer it overlapped; a bad one is removed there, and its source is dropped when the
    transfer beside it has ended (`settle`)."""
    if not sources:
        raise PeerError("no source to pull from: the plan gave this host none")
    for src in sources:
        cdir = (src.get("ssh") or {}).get("control_dir") or ""
        if len(cdir) > MAX_CONTROL_DIR:
            raise PeerError(f"control_dir {cdir!r} is {len(cdir)} bytes: SSH's control socket inside it would pass "
                            f"the 108-byte limit of a socket path; give one of at most {MAX_CONTROL_DIR} bytes")
    paths = model_paths(root, lock["repo_id"], lock["revision"])
    staging = paths["staging"]
    d = os.path.basename(os.path.dirname(paths["final"]))
    rel_status = os.path.relpath(paths["status"], root)
    rel_staging = os.path.relpath(staging, root)
    rel_final = os.path.relpath(paths["final"], root)
    scratch = os.path.join(staging, ".cache", "peer")
    os.makedirs(scratch, exist_ok=True)
    record = resume(staging, lock)
    total = sum(e["size"] for e in lock["files"])
    started = time.time()
    live = list(sources)
    dropped: list[dict] = []
    taken = {}  # file -> source host
    # record, taken, live, dropped and the status file are changed by this thread and by the hashing thread
    guard = threading.Lock()
    moving = {"name": None}  # the file rsync is moving now (for the status the hashing thread writes)

    def status(state, **extra):  # with guard held
        done = sum(e["size"] for e in lock["files"] if e["name"] in record)
        write_status(paths["status"], {
            "state": state, "repo_id": lock["repo_id"], "revision": lock["revision"], "via": "peer",
            "verified": sorted(record), "bytes_done": done, "bytes_total": total,
            "percent": round(100.0 * done / total, 1) if total else 100.0,
            "rate_bytes_per_s": (done - kept_bytes) / max(time.time() - started, 1e-9),
            "source": live[0]["host"] if live else None, "dropped": dropped, "pid": os.getpid(),
            "started_at": started, "updated_at": time.time(), **extra})

    def drop(host, reason):
        with guard:
            if not any(s["host"] == host for s in live):
                return  # dropped already (a second bad file of the same source)
            log(f"dropping source {host}: {reason}")
            dropped.append({"host": host, "reason": reason})
            live[:] = [s for s in live if s["host"] != host]

    def check(e, tmp, host):
        """In the hashing thread: keep the received file if it matches the lock, else remove it and return
        (source, reason)."""
        name = e["name"]
        algo, want = entry_digest(e)
        got, n = digest(tmp, algo)
        with guard:
            if n != e["size"] or got != want:
                os.unlink(tmp)  # never kept, never served
                return host, (f"it served {name} with {algo} {got} ({n} bytes), the lock says {want} "
                              f"({e['size']} bytes): the copy there is bad")
            final_p = os.path.join(staging, name)
            os.makedirs(os.path.dirname(final_p), exist_ok=True)
            os.replace(tmp, final_p)
            os.chmod(final_p, 0o644)
            s = os.stat(final_p)
            record[name] = {"algo": algo, "digest": got, "size": s.st_size, "mtime_ns": s.st_mtime_ns}
            save_record(staging, record)
            taken[name] = host
            status("receiving", **({"receiving": moving["name"]} if moving["name"] else {}))
        return None

    moved = threading.Event()  # set when the transfer that heartbeat watches has ended

    def heartbeat(name, tmp):
        """While rsync moves `name` (into `tmp`, in place): the status again each poll interval in which the file
        grew. A child times its source's progress by the status's updated_at: one file that takes longer than the
        stall time to move (a 9 GB shard on a slow link) is progress, and a transfer that moves nothing is not."""
        try:
            last = os.path.getsize(tmp)
        except OSError:
            last = 0
        while not moved.wait(poll_seconds):
            try:
                n = os.path.getsize(tmp)
            except OSError:
                continue
            if n != last:
                last = n
                with guard:
                    status("receiving", receiving=name, receiving_bytes=n)

    hashing = None  # (file, future) of the file being hashed

    def settle():
        """Wait for the file being hashed; drop its source if the copy was bad."""
        nonlocal hashing
        if hashing is not None:
            _name, fut = hashing
            hashing = None
            bad = fut.result()
            if bad is not None:
                drop(*bad)

    kept_bytes = sum(e["size"] for e in lock["files"] if e["name"] in record)
    with guard:
        status("receiving")
    last_seen: dict = {}  # source host -> (its status's updated_at, when that value last changed here)
    unread: dict = {}  # source host -> failed status reads in a row
    listed: dict = {}  # source host -> the files its last read status listed as verified
    hasher = ThreadPoolExecutor(max_workers=1)
    try:
        while True:
            if hashing is not None and hashing[1].done():
                settle()
            e = next((x for x in lock["files"] if x["name"] not in record
                      and (hashing is None or x["name"] != hashing[0])), None)
            if e is None:  # every file is kept, or the last one is being hashed
                if hashing is None:
                    break
                settle()
                continue
            name = e["name"]
            if not live:
                if hashing is not None:  # its outcome first: it is kept, or it is the file that has no source
                    settle()
                    continue
                why = "; ".join(f"{x['host']}: {x['reason']}" for x in dropped) or "none given"
                with guard:
                    status("failed", reason=f"no source left for {name}")
                raise PeerError(f"{lock['repo_id']}@{lock['revision'][:12]}: no source left to pull {name} from "
                                f"({why}); files verified so far are kept in {staging} - fix or drop the "
                                "failed host, then rerun")
            src = live[0]
            # a peer that listed this file as verified at its last read is not read again before it is taken: a
            # child behind its parent reads the status once for all the files the parent is ahead by, not once per
            # file (the read is a round trip before each transfer, and the parent does no such read of the origin)
            cached = name in listed.get(src["host"], ())
            reason = None
            if cached:
                last_seen.pop(src["host"], None)  # a stall is timed from the next read, not from before these files
            else:
                st = _source_status(src, rel_status, scratch, rsync, stall_seconds)
                now = time.monotonic()
                if st is None:
                    unread[src["host"]] = unread.get(src["host"], 0) + 1
                    if unread[src["host"]] < STATUS_TRIES:
                        time.sleep(poll_seconds)
                        continue
                    reason = (f"its status could not be read {STATUS_TRIES} times in a row (host down, or its SSH "
                              "access refused)")
                elif st.get("state") == "failed" or (st.get("revision") not in (None, lock["revision"])):
                    reason = f"it reported {st.get('state')!r} ({st.get('reason', 'another revision')})"
                else:
                    unread.pop(src["host"], None)
                    listed[src["host"]] = set(st.get("verified") or [])
                if reason is None and not src.get("complete") and name not in listed[src["host"]]:
                    stamp = st.get("updated_at")
                    prev = last_seen.get(src["host"])
                    if prev is None or prev[0] != stamp:
                        last_seen[src["host"]] = (stamp, now)
                    elif now - prev[1] > stall_seconds:
                        reason = (f"its own pull had not started after {stall_seconds:g} s (no status there)"
                                  if st.get("state") == "pending" else
                                  f"it made no progress for {stall_seconds:g} s")
                    if reason is None:
                        with guard:
                            status("receiving", waiting_for=name)
                        time.sleep(poll_seconds)
                        continue
            if reason is None:
                rel_dir = rel_final if src.get("complete") else rel_staging
                tmp = os.path.join(scratch, "files", name)
                os.makedirs(os.path.dirname(tmp), exist_ok=True)
                with guard:
                    moving["name"] = name
                    status("receiving", receiving=name)
                beat = threading.Thread(target=heartbeat, args=(name, tmp), daemon=True)
                beat.start()
                try:
                    rc, err = rsync(rsync_command(src, f"{rel_dir}/{name}", tmp, **src.get("ssh", {})),
                                    max(stall_seconds * 4, 3600.0 * e["size"] / 1e9 + stall_seconds))
                finally:
                    moved.set()
                    beat.join()
                    moved.clear()
                with guard:
                    moving["name"] = None
                settle()  # the file before this one, hashed while this one moved
                if rc == 0:
                    hashing = (name, hasher.submit(check, e, tmp, src["host"]))
                    continue
                if cached and rc == RSYNC_PARTIAL:  # gone since the read that listed it: read again, then decide
                    listed.pop(src["host"], None)
                    continue
                reason = f"rsync of {name} failed (exit {rc}: {err})"
            drop(src["host"], reason)
    finally:
        hasher.shutdown(wait=True)
    with guard:
        status("received", sources=sorted(set(taken.values())))
    seconds = time.time() - started
    moved = total - kept_bytes
    return {"model": d, "staging": staging, "files": len(lock["files"]), "bytes": total, "bytes_moved": moved,
            "kept": len(lock["files"]) - len(taken), "seconds": seconds, "bytes_per_s": moved / max(seconds, 1e-9),
            "sources": sorted(set(taken.values())), "dropped": dropped}


def finalize_recorded(*, root: str, lock: dict, owner: tuple[int, int] | None = None) -> dict:
    """Mark a pulled tree complete: every locked file must still be as it was when its digest matched the
    lock (its record); a file without one is hashed now. Raises PeerError naming a bad file; nothing is
    marked complete then."""
    paths = model_paths(root, lock["repo_id"], lock["revision"])
    staging = paths["staging"]
    record = load_record(staging)
    hashed = 0
    for e in lock["files"]:
        if recorded_ok(staging, e, record):
            continue
        p = os.path.join(staging, e["name"])
        algo, want = entry_digest(e)
        got, n = file_digest(p, algo) if os.path.isfile(p) else ("missing", 0)
        hashed += n
        if got != want or n != e["size"]:
            raise PeerError(f"{p}: {algo} {got} ({n} bytes) != the lock's {want} ({e['size']} bytes); nothing "
                            "was marked complete")
    try:
        os.unlink(os.path.join(staging, MARKER_DIR, RECORD))
    except FileNotFoundError:
        pass
    try:  # the pull's account (which hosts served, which were dropped) stays in the status file
        with open(paths["status"]) as f:
            pulled = json.load(f)
    except (OSError, ValueError):
        pulled = {}
    finalize(staging, paths["final"], lock, owner)
    write_status(paths["status"], {"state": "complete", "repo_id": lock["repo_id"], "revision": lock["revision"],
                                   "via": "peer", "sources": pulled.get("sources", []),
                                   "dropped": pulled.get("dropped", []), "updated_at": time.time()})
    return {"final": paths["final"], "bytes_hashed": hashed}
