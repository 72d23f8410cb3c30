"""GPU and port hygiene before a model service starts: find processes that hold GPU memory or the
service port and that no allowed unit owns, and (only when allowed) end them - TERM, wait, KILL - and
confirm the release.

Pure parts: `parse_proc_net_tcp`, `classify_holders`. I/O: `port_holders`, `terminate`."""

from __future__ import annotations

import os
import signal
import time

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.gpu import unit_of_pid_cgroup

TCP_LISTEN = "0A"


def parse_proc_net_tcp(text: str) -> list[dict]:
    """Rows of /proc/net/tcp or tcp6: local address, port, state, socket inode."""
    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10:
            continue
        addr, port = f[1].rsplit(":", 1)
        out.append({"local_addr_hex": addr, "port": int(port, 16), "state": f[3], "inode": int(f[9])})
    return out


def listening_inodes(port: int, proc_net=("/proc/net/tcp", "/proc/net/tcp6")) -> set[int]:
    inodes = set()
    for p in proc_net:
        try:
            with open(p) as fh:
                rows = parse_proc_net_tcp(fh.read())
        except OSError:
            continue
        inodes |= {r["inode"] for r in rows if r["port"] == port and r["state"] == TCP_LISTEN and r["inode"]}
    return inodes


def port_holders(port: int) -> list[dict]:
    """Processes with a listening socket on `port` (scanning /proc/<pid>/fd for the socket inodes)."""
    inodes = listening_inodes(port)
    if not inodes:
        return []
    found = []
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and int(link[8:-1]) in inodes:
                    found.append({"pid": pid, "port": port, "reason": f"listens on port {port}"})
                    break
        except OSError:
            continue
    return found


def describe(pid: int) -> dict:
    info = {"pid": pid, "name": None, "unit": None, "cmdline": None}
    try:
        with open(f"/proc/{pid}/comm") as f:
            info["name"] = f.read().strip()
        with open(f"/proc/{pid}/cgroup") as f:
            info["unit"] = unit_of_pid_cgroup(f.read())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            info["cmdline"] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    except OSError:
        pass
    return info


def classify_holders(holders: list[dict], allowed_units: list[str], self_pids: set[int]) -> list[dict]:
    """Strays: holders whose unit is not allowed (and that are not this very process tree)."""
    strays = []
    for h in holders:
        if h["pid"] in self_pids:
            continue
        if h.get("unit") and h["unit"] in allowed_units:
            continue
        strays.append(h)
    return strays


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def terminate(pids: list[int], grace_seconds: float = 10.0) -> dict:
    """TERM, wait up to grace_seconds, then KILL whatever is left. Returns what each needed."""
    how = {}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            how[pid] = "TERM"
        except ProcessLookupError:
            how[pid] = "gone"
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                how[pid] = "KILL"
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return how
