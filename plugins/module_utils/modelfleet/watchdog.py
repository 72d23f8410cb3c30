"""The liveness watchdog of served units: vLLM's /health can answer 200 for minutes while nothing can be generated
(an engine process stopped or hung, a dead worker of a group), and the API process does not exit, so systemd's
Restart= never fires. On every host the vllm_service role installs a timer (modelfleet-watchdog.timer) whose
service runs roles/vllm_service/files/modelfleet-watchdog.py with the system's python3 (no Ansible there): for each
served unit described under /etc/modelfleet/watchdog/, one real completion of one token with a timeout (readiness.
look); `failures` failures in a row restart the unit, with the reason in the journal and in the unit's state file.

`decide` is the rule (pure, unit-tested); `check` is the glue for one unit (systemctl, the probe, the state file).

A headless member of a multi-host group (issue 24) serves no HTTP: its probe is whether the unit's own processes
still hold an established TCP connection to the head's address (`holds_connection`, read from /proc): a pipeline
member's to the rendezvous store on the group port and to the head's message queues, a data-parallel rank's to
ports the head picked at start - measured with vLLM 0.32 CPU, a data-parallel rank holds no connection to the
group (rpc) port once the group is up, so a rule on that port alone would restart it forever. When the head stops,
those connections are closed (the follower's side sits in CLOSE-WAIT, no error is logged) and the follower never
joins a restarted head, so it is restarted; a follower restarted while the old head still runs joins its store
and hangs, the head's completions fail, the head's own watchdog restarts it, and the follower follows. A socket
the head closed (CLOSE-WAIT) with none established is proof the member had joined, even when no look saw it
joined: under load a restarted follower can join the old head and lose it between two looks, and counted as
"still starting" it would wait out its whole start budget beside a new head that waits for it. A head *host*
that loses power closes nothing, and an idle group sends nothing: vLLM sets no TCP keepalive, so the member's
connections would stay ESTABLISHED forever. The watchdog turns keepalive on for the member's connections to the
head (`keep_alive`: a duplicate of the socket taken with pidfd_getfd; the options belong to the socket), so the
kernel probes a silent head and drops the connection when nothing answers - the member is then out of its group.
Each host judges only what it can see, and the group restarts as a whole without one host reaching into another.
A unit that is not active is left alone (stopped on purpose, or systemd is restarting it); one started less than `grace`
seconds ago that has not answered yet is starting, not failing (its start budget, TimeoutStartSec, is the grace)."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import time

STATE_DIR = "/var/lib/modelfleet-watchdog"
# TCP keepalive on a headless member's connections to its head: first probe after `idle` s without traffic, then
# every `interval` s; `count` unanswered probes drop the connection - a head host gone silent is seen in about a
# minute, then the member's looks count as for a head that stopped
KEEPALIVE = {"idle": 30, "interval": 10, "count": 3}
SYS_PIDFD_GETFD = 438  # one number on every architecture (Linux 5.6)
# /run/modelfleet-watchdog/pause/<unit> holds an epoch: until then the unit is not probed (the benchmark role
# pauses the units it measures - a probe is another client, and its tokens would be counted in the point); a
# pause whose writer died ends by itself
PAUSE_DIR = "/run/modelfleet-watchdog/pause"


def decide(state: dict, unit: dict, probe: tuple | None, failures: int, grace: float,
           paused: bool = False) -> tuple[dict, str]:
    """The next state and the action ("none", "probe" or "restart") for one unit.

    state: what the last runs kept {invocation, answered, failures, last_failure}; unit: {active: bool,
    invocation: systemd's InvocationID, active_seconds: since it became active}; probe: None to ask whether to
    probe, else (ok, reason) of the probe just made, or (ok, reason, had_joined) where the probe found proof that
    the unit had answered before (a headless member's connection the head closed): its failures count at once, not
    after its grace; paused: a benchmark is measuring the unit (no probe; the failures so far are kept)."""
    if not unit["active"]:
        return {"invocation": None, "answered": False, "failures": 0}, "none"
    if state.get("invocation") != unit["invocation"]:  # a new start: its history is its own
        state = {"invocation": unit["invocation"], "answered": False, "failures": 0}
    if probe is None:
        return state, "none" if paused else "probe"
    ok, reason = probe[0], probe[1]
    if ok:
        return dict(state, answered=True, failures=0), "none"
    if len(probe) > 2 and probe[2]:
        state = dict(state, answered=True)
    if not state.get("answered") and unit["active_seconds"] < grace:
        return state, "none"  # still starting
    state = dict(state, failures=state.get("failures", 0) + 1, last_failure=reason)
    if state["failures"] >= failures:
        return state, "restart"
    return state, "none"


def _show(unit: str) -> dict:
    out = subprocess.run(["systemctl", "show", unit, "-p", "ActiveState", "-p", "InvocationID",
                          "-p", "ActiveEnterTimestampMonotonic"], capture_output=True, text=True, check=False).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    entered = int(props.get("ActiveEnterTimestampMonotonic") or 0) / 1e6
    return {"active": props.get("ActiveState") == "active", "invocation": props.get("InvocationID") or None,
            "active_seconds": max(0.0, time.monotonic() - entered) if entered else 0.0}


def _api_key(env_file: str) -> str | None:
    try:
        with open(env_file) as f:
            for line in f:
                if line.startswith("VLLM_API_KEY="):
                    return line.split("=", 1)[1].strip() or None
    except OSError:
        pass
    return None


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def paused(unit: str, pause_dir: str = PAUSE_DIR, now: float | None = None) -> bool:
    """Whether a pause for this unit is in force (a file holding an epoch in the future)."""
    try:
        with open(os.path.join(pause_dir, unit)) as f:
            until = float(f.read().strip() or 0)
    except (OSError, ValueError):
        return False
    return until > (time.time() if now is None else now)


def _tcp_address(hexaddr: str) -> tuple[ipaddress._BaseAddress, int]:
    """An address of /proc/net/tcp{,6} ("0100007F:1F90"): host byte order per 32-bit word, the port big-endian.
    IPv4-mapped IPv6 addresses (a dual-stack listener's peers) are given as IPv4."""
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip, int(port, 16)


ESTABLISHED, CLOSE_WAIT = "01", "08"  # /proc/net/tcp's st column


def connections(tables: list[str], inodes: set[int], address: str, port: int | None = None,
                state: str = ESTABLISHED) -> set[int]:
    """Which of the sockets `inodes` are TCP connections to `address` (on `port`, or on any port when None) in
    `state` (ESTABLISHED; CLOSE_WAIT: the peer closed it, this side not yet), read from the text of /proc/net/tcp
    and /proc/net/tcp6 (`tables`). Pure: the unit's socket inodes come from `unit_sockets`."""
    want = ipaddress.ip_address(address)
    found = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            f = line.split()
            if len(f) < 10 or f[3] != state:
                continue
            try:
                inode = int(f[9])
                ip, rport = _tcp_address(f[2])
            except ValueError:
                continue
            if inode in inodes and ip == want and (port is None or rport == port):
                found.add(inode)
    return found


def holds_connection(tables: list[str], inodes: set[int], address: str, port: int | None = None,
                     state: str = ESTABLISHED) -> bool:
    """Whether one of the sockets `inodes` is a TCP connection to `address` in `state` (`connections`)."""
    return bool(connections(tables, inodes, address, port, state))


def unit_sockets(unit: str, proc: str = "/proc") -> dict[int, tuple[int, int]]:
    """The sockets every process of the unit's control group holds (a worker whose parent died is still in the group:
    KillMode=control-group), as {inode: (pid, fd)} - one holder each. A process belongs to the unit when its cgroup
    (v2, /proc/<pid>/cgroup) is the unit's or below it; read from /proc, not /sys/fs/cgroup, whose root differs
    inside a cgroup namespace."""
    out: dict[int, tuple[int, int]] = {}
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(f"{proc}/{pid}/cgroup") as f:
                paths = [line.split(":", 2)[2].strip() for line in f if line.startswith("0::")]
        except (OSError, IndexError):
            continue
        if any(p.endswith("/" + unit) or f"/{unit}/" in p for p in paths):
            for inode, fd in socket_fds(f"{proc}/{pid}/fd").items():
                out.setdefault(inode, (int(pid), fd))
    return out


def unit_socket_inodes(unit: str, proc: str = "/proc") -> set[int]:
    """The socket inodes every process of the unit's control group holds (`unit_sockets`)."""
    return set(unit_sockets(unit, proc))


def socket_fds(fd_dir: str) -> dict[int, int]:
    """The sockets among one process's open files (its /proc/<pid>/fd folder), as {inode: fd}."""
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return {}
    out = {}
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and fd.isdigit():
            out.setdefault(int(target[8:-1]), int(fd))
    return out


def socket_inodes(fd_dir: str) -> set[int]:
    """The socket inodes among one process's open files (its /proc/<pid>/fd folder)."""
    return set(socket_fds(fd_dir))


def _pidfd_getfd(pidfd: int, fd: int) -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    r = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
    if r < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return r


def keep_alive(pid: int, fd: int, idle: int, interval: int, count: int) -> None:
    """Turn TCP keepalive on for a socket another process holds (its fd `fd`): a duplicate taken with pidfd_getfd
    (root with CAP_SYS_PTRACE) carries the options to the socket itself, then is closed - the process's own fd and
    connection are untouched. Raises OSError (the process or fd is gone, or the capability is missing)."""
    pidfd = os.pidfd_open(pid)
    try:
        dup = _pidfd_getfd(pidfd, fd)
    finally:
        os.close(pidfd)
    s = socket.socket(fileno=dup)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
    finally:
        s.close()


def keepalive_timers(tables: list[str], inodes: set[int]) -> set[int]:
    """Which of the sockets `inodes` have the keepalive timer pending (/proc/net/tcp's `tr` column 2): what
    `keep_alive` set, seen by the kernel. Pure."""
    found = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            f = line.split()
            if len(f) < 10:
                continue
            try:
                if int(f[9]) in inodes and f[5].split(":")[0] == "02":
                    found.add(int(f[9]))
            except ValueError:
                continue
    return found


def follower_joined(tables: list[str], inodes: set[int], cfg: dict) -> tuple[bool, str, bool]:
    """A headless member's probe, pure: (joined, what was found, had joined) from the /proc/net/tcp{,6} texts and the
    member's socket inodes. Any port of the head counts: a pipeline member holds the head's store (the group port)
    and its message queues, a data-parallel rank only connections to ports the head picked at start (its rpc port
    serves the handshake and is closed once the group is up). Not joined but holding a connection the head closed
    (CLOSE-WAIT): it had joined, and its head is gone - out of its group, not starting."""
    if holds_connection(tables, inodes, cfg["head"]):
        return True, f"joined: connected to the head {cfg['head']}", True
    if holds_connection(tables, inodes, cfg["head"], state=CLOSE_WAIT):
        return False, (f"left: the head {cfg['head']} closed its connection (CLOSE-WAIT, group port "
                       f"{cfg['group_port']}; the head stopped or restarted)"), True
    return False, (f"not joined: no connection to the head {cfg['head']} (group port {cfg['group_port']}; the head "
                   "stopped or restarted)"), False


def tcp_tables(proc: str = "/proc") -> list[str]:
    """The texts of /proc/net/tcp and /proc/net/tcp6 (one missing, as without IPv6, is left out)."""
    tables = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{name}") as f:
                tables.append(f.read())
        except OSError:
            pass
    return tables


def _follower_probe(cfg: dict, state: dict, log) -> tuple[bool, str, bool]:
    """A headless member's look (follower_joined) and, while it is joined, keepalive on its connections to the head;
    a failure to set it is said once per cause (kept in state["keepalive_error"])."""
    tables, socks = tcp_tables(), unit_sockets(cfg["unit"])
    joined, detail, had_joined = follower_joined(tables, set(socks), cfg)
    if joined:
        ka = dict(KEEPALIVE, **cfg.get("keepalive", {}))
        errors = []
        for inode in sorted(connections(tables, set(socks), cfg["head"])):
            try:
                keep_alive(*socks[inode], idle=int(ka["idle"]), interval=int(ka["interval"]), count=int(ka["count"]))
            except OSError as e:
                errors.append(f"{type(e).__name__}: {e}")
        error = errors[0] if errors else None
        if error and error != state.get("keepalive_error"):
            log(f"{cfg['unit']}: could not turn TCP keepalive on for its connections to the head ({error}); a head "
                "host that loses power would not be noticed (the watchdog needs root with CAP_SYS_PTRACE)")
        state["keepalive_error"] = error
    return joined, detail, had_joined


def check(cfg: dict, state_dir: str, look, log, pause_dir: str = PAUSE_DIR) -> str:
    """One look at one unit described by cfg {unit, url, served_name, env_file, prompt, timeout, failures, grace},
    probing with `look` (readiness.look) and saying what it finds with `log`; returns the action taken. A headless
    group member is described by {unit, head, group_port, failures, grace} instead: its probe is its connection
    to the head (`holds_connection`)."""
    unit = cfg["unit"]
    path = os.path.join(state_dir, unit + ".json")
    state = _load(path)
    last_restart = state.get("last_restart")
    info = _show(unit)
    state, action = decide(state, info, None, int(cfg["failures"]), float(cfg["grace"]), paused(unit, pause_dir))
    follower = "head" in cfg
    if action == "probe":
        had_joined = False
        if follower:
            ok, detail, had_joined = _follower_probe(cfg, state, log)
            what = "a look at its connection to the group's head"
        else:
            stage, detail, _text = look(cfg["url"], cfg["served_name"], _api_key(cfg.get("env_file", "")),
                                        prompt=cfg.get("prompt") or "Hello", max_tokens=1,
                                        completion_timeout=float(cfg["timeout"]))
            ok, detail = stage == "ready", f"{stage}: {detail}"
            what = "a 1-token completion"
        state, action = decide(state, info, (ok, detail, had_joined), int(cfg["failures"]), float(cfg["grace"]))
        if not ok and state.get("failures"):
            log(f"{unit}: {what} failed ({state['failures']} of {cfg['failures']} in a row): {detail}")
    if action == "restart":
        why = (f"{state['failures']} looks in a row found it out of its group (last: {state['last_failure']})"
               if follower else
               f"{state['failures']} real completions failed in a row ({cfg['timeout']} s allowed each; "
               f"last: {state['last_failure']})")
        log(f"{unit}: restarting: {why}")
        r = subprocess.run(["systemctl", "restart", "--no-block", unit], capture_output=True, text=True, check=False)
        state = {"invocation": None, "answered": False, "failures": 0,
                 "last_restart": {"at": time.time(), "reason": why, "rc": r.returncode}}
        if r.returncode != 0:
            log(f"{unit}: systemctl restart failed: {r.stderr.strip()}")
    else:
        state = dict(state, last_restart=last_restart)
    _save(path, state)
    return action
