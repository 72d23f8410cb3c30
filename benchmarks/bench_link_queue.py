"""One emulated link, both ways full (issue 23): what the link's queue does to TCP when a host's download's
acknowledgements share its upload's queue with its own bulk data, as on a middle host of a peer chain.

    python benchmarks/bench_link_queue.py [--rate-mbit 25] [--seconds 15] [--queues fifo acks-first]

Two network namespaces joined by a veth pair, each interface's egress limited as scripts/netfleet.sh limits a
link of the emulated fleet (its `shape`, with NETFLEET_QUEUE set to each queue in turn). For each queue: one bulk
TCP flow one way, then one each way at once (plain sockets, the kernel's congestion control). Printed per case:
each flow's rate, and each side's TCP segments retransmitted and packets its queue dropped. Asserts nothing."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NS = ("mfq-a", "mfq-b")
ADDR = ("10.78.0.1", "10.78.0.2")
PORT = 5001


def sh(*cmd: str, env: dict | None = None) -> str:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, env=env).stdout


def receive(addr: str) -> None:
    """Accept one connection, read it to its end, print the rate in Mbit/s."""
    srv = socket.create_server((addr, PORT))
    conn, _ = srv.accept()
    n, t0 = 0, time.monotonic()
    while chunk := conn.recv(1 << 16):
        n += len(chunk)
    print(f"{n * 8 / (time.monotonic() - t0) / 1e6:.2f}")


def send(addr: str, seconds: float) -> None:
    for _ in range(100):  # the receiver may not listen yet
        try:
            conn = socket.create_connection((addr, PORT))
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    buf, end = b"\0" * (1 << 16), time.monotonic() + seconds
    while time.monotonic() < end:
        conn.sendall(buf)
    conn.close()


def counters(ns: str, dev: str) -> tuple[int, int, int]:
    rows = [line.split() for line in sh("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").splitlines()
            if line.startswith("Tcp:")]
    tcp = dict(zip(rows[0][1:], map(int, rows[1][1:]), strict=True))
    tc = sh("ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev)
    return tcp["OutSegs"], tcp["RetransSegs"], int(re.search(r"dropped (\d+)", tc).group(1))


def link_up(queue: str, rate: int) -> None:
    link_down()
    for ns in NS:
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", "qa", "netns", NS[0], "type", "veth", "peer", "name", "qb", "netns", NS[1])
    env = {**os.environ, "NETFLEET_QUEUE": queue}
    for ns, dev, addr in zip(NS, ("qa", "qb"), ADDR, strict=True):
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh(str(ROOT / "scripts" / "netfleet.sh"), "shape", ns, dev, str(rate), env=env)


def link_down() -> None:
    for ns in NS:
        subprocess.run(["ip", "netns", "delete", ns], check=False, capture_output=True)


def case(queue: str, rate: int, seconds: float, both: bool) -> str:
    link_up(queue, rate)
    me = [sys.executable, __file__]
    recv = [subprocess.Popen(["ip", "netns", "exec", NS[1], *me, "--receive", ADDR[1]], stdout=subprocess.PIPE,
                             text=True)]
    if both:
        recv.append(subprocess.Popen(["ip", "netns", "exec", NS[0], *me, "--receive", ADDR[0]],
                                     stdout=subprocess.PIPE, text=True))
    senders = [subprocess.Popen(["ip", "netns", "exec", NS[0], *me, "--send", ADDR[1], str(seconds)])]
    if both:
        senders.append(subprocess.Popen(["ip", "netns", "exec", NS[1], *me, "--send", ADDR[0], str(seconds)]))
    for p in senders:
        p.wait()
    rates = [p.communicate()[0].strip() for p in recv]
    sides = []
    for ns, dev in zip(NS, ("qa", "qb"), strict=True):
        sent, retr, drops = counters(ns, dev)
        sides.append(f"{ns[-1]}: {100 * retr / max(sent, 1):.1f}% of {sent} segments retransmitted, {drops} dropped")
    link_down()
    flows = " and ".join(f"{r} Mbit/s" for r in rates)
    return f"{'both ways' if both else 'one way  '}: {flows}; {'; '.join(sides)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate-mbit", type=int, default=25)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--queues", nargs="+", choices=["fifo", "acks-first"], default=["fifo", "acks-first"])
    ap.add_argument("--receive", help=argparse.SUPPRESS)
    ap.add_argument("--send", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.receive:
        receive(a.receive)
        return 0
    if a.send:
        send(a.send[0], float(a.send[1]))
        return 0
    if os.geteuid() != 0:
        print("bench_link_queue.py: must run as root (network namespaces)", file=sys.stderr)
        return 2
    cc = sh("sysctl", "-n", "net.ipv4.tcp_congestion_control").strip()
    print(f"one link of {a.rate_mbit} Mbit/s each way, {a.seconds:g}-s flows, TCP congestion control {cc}")
    try:
        for queue in a.queues:
            for both in (False, True):
                print(f"  {queue:10s} {case(queue, a.rate_mbit, a.seconds, both)}", flush=True)
    finally:
        link_down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
