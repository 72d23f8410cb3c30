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
import select
import shlex
import shutil
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
                  control_dir: str = "", timeout: int = 60, append: bool = True, files_from: str = "",
                  connection: str = "s") -> list[str]:
    """The rsync command that copies `rel` (relative to the source's models root) to `dest`. A source with an
    address is reached over SSH as source['user'] (its authorized key runs rrsync, read-only, confined to the
    models root, so paths are relative to it); without one it is a local folder (source['root']).
    `files_from`: a file of NUL-separated names relative to the folder `rel`, all moved in this one session into
    the folder `dest` (one line per file on stdout, `%n`, as rsync begins it). `connection`: which of the shared
    SSH connections to the source it goes over (CONNECTIONS)."""
    args = ["rsync", "--times", f"--timeout={int(timeout)}"]
    if append:
        args.append("--append-verify")  # a partial file from a killed pull is continued, then checked whole
    else:  # a status: copied every time. rsync's quick check skips a file of the same size and the same second, so a
        # status rewritten in the second it was last read (a growing file's heartbeat) would read as unchanged
        args.append("--ignore-times")
    if files_from:
        args += ["--from0", f"--files-from={files_from}", "--out-format=%n"]
        rel, dest = rel.rstrip("/") + "/", dest.rstrip("/") + "/"
    if not source.get("address"):
        return [*args, os.path.join(source["root"], rel), dest]
    ssh = ["ssh", "-p", str(int(source.get("port") or 22)), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
           "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "IdentitiesOnly=yes"]
    if key:
        ssh += ["-i", key]
    if known_hosts:
        ssh += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    if control_dir:  # shared SSH connections to each source for the many small status reads and the sessions
        ssh += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/{connection}-%C", "-o",
                "ControlPersist=60"]
    return [*args, "-e", shlex.join(ssh), f"{source.get('user') or 'modelfleet-peer'}@{source['address']}:{rel}",
            dest]


def run_rsync(cmd: list[str], timeout: float, on_line=None, cancel: threading.Event | None = None) -> tuple[int, str]:
    """Run rsync; (exit status, the tail of what it said). `on_line(text)` is called with each line rsync writes
    on stdout as it comes; `cancel`, once set, ends rsync (SIGTERM: an in-place partial file stays)."""
    if on_line is None and cancel is None:
        try:
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                               check=False)
        except subprocess.TimeoutExpired:
            return 124, f"rsync did not finish in {timeout:g} s"
        return p.returncode, (p.stderr or p.stdout).strip()[-400:]
    # rsync ends with the pull (SIGTERM when the thread that started it is gone, util-linux's setpriv): a session
    # left running by a killed pull would go on writing its run of files while a rerun moves the same files
    setpriv = shutil.which("setpriv")
    argv = [setpriv, "--pdeathsig", "TERM", "--", *cmd] if setpriv else cmd
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    fd, buf, why = proc.stdout.fileno(), b"", ""
    try:
        while True:
            if cancel is not None and cancel.is_set():
                why = "ended by the pull"
                break
            if time.monotonic() > deadline:
                why = f"rsync did not finish in {timeout:g} s"
                break
            if select.select([fd], [], [], 0.1)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                *lines, buf = (buf + chunk).split(b"\n")
                for line in lines:
                    if on_line is not None:
                        on_line(line.decode(errors="replace"))
    finally:
        if proc.poll() is None and why:
            proc.terminate()
        try:
            rc = proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        reader.join()
        proc.stdout.close()
        proc.stderr.close()
    if why.startswith("rsync did not"):
        return 124, why
    return rc, (why or b"".join(err).decode(errors="replace")).strip()[-400:]


class _Session:
    """One rsync session that moves a run of files from one source, in its own thread. `started` lists the
    files in the order rsync began them (its `%n` lines). rsync's receiver takes one file at a time, so a file
    is whole once the file begun after it exists here, or once the session ended well (`received`)."""

    def __init__(self, src: dict, names: list[str], cmd: list[str], timeout: float, rsync, listed: bool,
                 connection: str):
        self.src, self.names, self.listed, self.connection = src, names, listed, connection
        self.want = set(names)
        self.started: list[str] = []
        self.handed: set = set()  # files given to the hash
        self._mark, self._near = None, False  # (file, when, its size then), and whether it was ending then
        self.rc, self.err = None, ""
        self.cancel, self.ended = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, args=(cmd, timeout, rsync), daemon=True)
        self.thread.start()

    def _line(self, text: str) -> None:
        if text in self.want and text not in self.started:
            self.started.append(text)

    def _run(self, cmd, timeout, rsync) -> None:
        try:
            self.rc, self.err = rsync(cmd, timeout, on_line=self._line, cancel=self.cancel)
        except Exception as e:  # noqa: BLE001 - any failure of the transport is this session's failure
            self.rc, self.err = 1, f"{type(e).__name__}: {e}"
        finally:
            self.ended.set()

    def on_last(self) -> bool:
        return len(self.started) >= len(self.names)

    def ending(self, path_of, size_of, lead: float) -> bool:
        """On its last file, and that file whole within `lead` seconds at the rate it grew over the last second."""
        if not self.on_last():
            return False
        name, now = self.started[-1], time.monotonic()
        try:
            n = os.path.getsize(path_of(name))
        except OSError:
            return False
        if self._mark is None or self._mark[0] != name:
            self._mark, self._near = (name, now, n), False
        elif now - self._mark[1] >= 0.25:
            rate = (n - self._mark[2]) / (now - self._mark[1])
            self._near = rate > 0 and (size_of(name) - n) / rate <= lead
            if now - self._mark[1] > 1.0:
                self._mark = (name, now, n)
        return self._near

    def received(self, path_of) -> list[str]:
        """The files now whole and not yet handed to the hash, in the order they arrived."""
        ended_well = self.ended.is_set() and self.rc == 0
        started = list(self.started)
        out = []
        if ended_well:
            for x in [*started, *self.names]:
                if x not in self.handed and x not in out and os.path.isfile(path_of(x)):
                    out.append(x)
        else:
            for i in range(len(started) - 1):
                if started[i] in self.handed:
                    continue
                if not os.path.lexists(path_of(started[i + 1])):
                    break
                out.append(started[i])
        self.handed.update(out)
        return out


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


# The shared SSH connections to a source (ControlMaster), by use: "s" for status reads, "0" and "1" for the sessions
# (one beside the other while the first moves its last file). Multiplexed over one connection, a small read or a
# new session's handshake waits behind the bulk data already in that connection's buffers (status reads took a
# median of 2.5 s beside a transfer at 25 Mbit/s); on connections of their own, they wait only in the link's queue.
CONNECTIONS = ("s", "0", "1")
# seconds before a session's last file is whole at which the source's status is read and the next session begun:
# about a status read and a session's start on a loaded link (0.3 s each at 25 Mbit/s in a chain of 8 on this
# 2-core machine), so that the next file's bytes follow the last one's without the two sharing the link for long
LEAD = 1.0
# a socket path is at most 107 bytes: the folder, "/", the connection and "-", %C (40 hex digits) and the 17
# characters ssh adds while it creates the socket
MAX_CONTROL_DIR = 107 - 1 - 2 - 40 - 17


def close_connections(sources: list[dict]) -> None:
    """End the shared SSH connections to each source (ControlMaster): none outlives the pull."""
    for src in sources:
        cdir = (src.get("ssh") or {}).get("control_dir")
        if not cdir or not src.get("address"):
            continue
        dest = f"{src.get('user') or 'modelfleet-peer'}@{src['address']}"
        port = str(int(src.get("port") or 22))
        for c in CONNECTIONS:
            subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={cdir}/{c}-%C", "-p", port, dest],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False)


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

    The files a source has (all, for the origin; those its last read status lists, for a peer) move in one rsync
    session: a session's start is several round trips (the SSH channel, rrsync, rsync's handshake), which on a
    link whose queue is full cost a good part of a file's time when paid per file. While a session moves its last
    file, the source's status is read again and the next session starts beside it, so the link does not idle
    between sessions. Each file is hashed as soon as it is whole, while the next one moves (one hashing thread),
    renamed into staging and listed in the status when it matched, so children do not wait for the session to
    end; a bad one is removed there and its source dropped (its sessions ended). A file a killed pull left half
    moved continues in a session of its own (`--append-verify`)."""
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
    files_dir = os.path.join(scratch, "files")
    os.makedirs(files_dir, exist_ok=True)
    record = resume(staging, lock)
    entries = {e["name"]: e for e in lock["files"]}
    total = sum(e["size"] for e in lock["files"])
    started = time.time()
    live = list(sources)
    dropped: list[dict] = []
    taken = {}  # file -> source host
    # record, taken, live, dropped and the status file are changed by this thread and by the hashing thread
    guard = threading.Lock()
    moving = {"name": None}  # the file rsync began last (for the status the hashing thread writes)
    sessions: list[_Session] = []
    count = {"sessions": 0}

    def tmp_of(name):
        return os.path.join(files_dir, name)

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
        for sess in sessions:
            if sess.src["host"] == host:
                sess.cancel.set()

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

    def begin(src, batch, listed_by_src):
        """A session for `batch` (entries) from `src`."""
        names = [e["name"] for e in batch]
        count["sessions"] += 1
        lst = os.path.join(scratch, f"files-{count['sessions'] % 4}.list")  # at most 2 run at once
        with open(lst, "wb") as f:
            f.write(b"".join(n.encode() + b"\0" for n in names))
        rel_dir = rel_final if src.get("complete") else rel_staging
        size = sum(e["size"] for e in batch)
        used = {x.connection for x in sessions}
        conn = next(c for c in CONNECTIONS[1:] if c not in used)  # not the one of the session it starts beside
        cmd = rsync_command(src, rel_dir, files_dir, files_from=lst, connection=conn, **src.get("ssh", {}))
        sessions.append(_Session(src, names, cmd, max(stall_seconds * 4, 3600.0 * size / 1e9 + stall_seconds),
                                 rsync, listed_by_src, conn))
        with guard:
            moving["name"] = names[0]
            status("receiving", receiving=names[0])

    hashing: dict = {}  # file -> the future of its check, in the order the files arrived
    hasher = ThreadPoolExecutor(max_workers=1)

    def hand_over():
        """Received files to the hash; hash outcomes taken (a bad copy drops its source)."""
        for sess in sessions:
            for name in sess.received(tmp_of):
                hashing[name] = hasher.submit(check, entries[name], tmp_of(name), sess.src["host"])
        for name, fut in list(hashing.items()):
            if fut.done():
                del hashing[name]
                bad = fut.result()
                if bad is not None:
                    drop(*bad)

    kept_bytes = sum(e["size"] for e in lock["files"] if e["name"] in record)
    with guard:
        status("receiving")
    last_seen: dict = {}  # source host -> (its status's updated_at, when that value last changed here)
    unread: dict = {}  # source host -> failed status reads in a row
    listed: dict = {}  # source host -> the files its last read status listed as verified
    read_at: dict = {}  # source host -> when its status was last read (monotonic)
    gone: dict = {}  # source host -> files it listed but could not serve once (read again before it is dropped)
    beat: dict = {}  # file -> its size at the last heartbeat
    next_beat = time.monotonic() + poll_seconds
    tick = min(0.05, poll_seconds)
    try:
        while True:
            hand_over()
            for sess in [x for x in sessions if x.ended.is_set()]:
                hand_over()  # what it received before it ended
                sessions.remove(sess)
                host = sess.src["host"]
                left = [x for x in sess.names if x not in sess.handed]
                if sess.cancel.is_set() or not left:
                    continue
                if sess.rc == 0:
                    drop(host, f"rsync ended without moving {left[0]}")
                    continue
                absent = [x for x in left if not os.path.lexists(tmp_of(x))]
                if sess.listed and sess.rc == RSYNC_PARTIAL and absent and not set(absent) & gone.get(host, set()):
                    # gone since the read that listed it: read again, then decide
                    gone.setdefault(host, set()).update(absent)
                    listed.pop(host, None)
                    continue
                failed = absent[0] if sess.rc == RSYNC_PARTIAL and absent else \
                    (sess.started[-1] if sess.started else left[0])
                drop(host, f"rsync of {failed} failed (exit {sess.rc}: {sess.err})")
            busy = set(hashing) | {x for sess in sessions for x in sess.names if x not in sess.handed}
            remaining = [e for e in lock["files"] if e["name"] not in record and e["name"] not in busy]
            if not remaining and not sessions and not hashing:
                break
            now = time.monotonic()
            # heartbeat: the status again each poll interval in which a moving file grew. A child times its source's
            # progress by the status's updated_at: one file that takes longer than the stall time to move (a 9 GB
            # shard on a slow link) is progress, and a transfer that moves nothing is not
            if now >= next_beat:
                next_beat = now + poll_seconds
                for sess in sessions:
                    name = sess.started[-1] if sess.started else None
                    if name is None or name in sess.handed:
                        continue
                    try:
                        n = os.path.getsize(tmp_of(name))
                    except OSError:
                        continue
                    if beat.get(name) != n:
                        beat[name] = n
                        with guard:
                            moving["name"] = name
                            status("receiving", receiving=name, receiving_bytes=n)
            if not live:
                if sessions or hashing:  # their outcome first: kept, or the files that have no source
                    time.sleep(tick)
                    continue
                name = remaining[0]["name"]
                why = "; ".join(f"{x['host']}: {x['reason']}" for x in dropped) or "none given"
                with guard:
                    status("failed", reason=f"no source left for {name}")
                raise PeerError(f"{lock['repo_id']}@{lock['revision'][:12]}: no source left to pull {name} from "
                                f"({why}); files verified so far are kept in {staging} - fix or drop the "
                                "failed host, then rerun")
            src = live[0]
            host = src["host"]
            # a new session starts when none runs, or beside one of the same source whose last file is about to be
            # whole (LEAD): its status is read then, and the new session's start overlaps the end of that file
            room = not sessions or (len(sessions) == 1 and sessions[0].src is src
                                    and sessions[0].ending(tmp_of, lambda x: entries[x]["size"], LEAD))
            if not remaining or not room:
                time.sleep(tick)
                continue
            has = None if src.get("complete") else listed.get(host, set())
            avail = [e for e in remaining if has is None or e["name"] in has]
            if avail:
                # a peer that listed these files at its last read is not read again before they are taken: a
                # child behind its parent reads the status once for all the files the parent is ahead by
                last_seen.pop(host, None)  # a stall is timed from the next read, not from before these files
                if os.path.lexists(tmp_of(avail[0]["name"])):
                    batch = avail[:1]  # half moved by a killed pull: continued on its own (--append-verify)
                else:
                    batch = []
                    for e in avail:
                        if os.path.lexists(tmp_of(e["name"])):
                            break
                        batch.append(e)
                begin(src, batch, has is not None)
                continue
            if now - read_at.get(host, -1e18) < poll_seconds:
                time.sleep(tick)
                continue
            read_at[host] = now
            st = _source_status(src, rel_status, scratch, rsync, stall_seconds)
            now = time.monotonic()
            reason = None
            if st is None:
                unread[host] = unread.get(host, 0) + 1
                if unread[host] >= STATUS_TRIES:
                    reason = (f"its status could not be read {STATUS_TRIES} times in a row (host down, or its SSH "
                              "access refused)")
            elif st.get("state") == "failed" or (st.get("revision") not in (None, lock["revision"])):
                reason = f"it reported {st.get('state')!r} ({st.get('reason', 'another revision')})"
            else:
                unread.pop(host, None)
                listed[host] = set(st.get("verified") or [])
                if sessions:  # the stall clock runs only while nothing moves from this source
                    last_seen.pop(host, None)
                elif not any(e["name"] in listed[host] for e in remaining):
                    stamp = st.get("updated_at")
                    prev = last_seen.get(host)
                    if prev is None or prev[0] != stamp:
                        last_seen[host] = (stamp, now)
                    elif now - prev[1] > stall_seconds:
                        reason = (f"its own pull had not started after {stall_seconds:g} s (no status there)"
                                  if st.get("state") == "pending" else
                                  f"it made no progress for {stall_seconds:g} s")
                    if reason is None:
                        with guard:
                            status("receiving", waiting_for=remaining[0]["name"])
            if reason is not None:
                drop(host, reason)
    finally:
        for sess in sessions:
            sess.cancel.set()
        for sess in sessions:
            sess.thread.join()
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
