"""The emulated network's links (scripts/netfleet.sh shape, which every host of a distribution run gets both ways):
limited to their rate, TCP's acknowledgements in a queue of their own ahead of the bulk (acks-first), or one tbf
queue (fifo), and a wrong queue name refused with nothing changed. Real TCP across a veth pair between two network
namespaces; the classes' own counters say where the packets went."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NETFLEET = str(ROOT / "scripts" / "netfleet.sh")
RECEIVE = """
import socket, sys, time
srv = socket.create_server((sys.argv[1], 5001))
print("listening", flush=True)
conn, _ = srv.accept()
n, t0 = 0, time.monotonic()
while chunk := conn.recv(1 << 16):
    n += len(chunk)
print(n, time.monotonic() - t0, flush=True)
"""
SEND = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], 5001))
end, buf = time.monotonic() + float(sys.argv[2]), b"\\0" * (1 << 16)
while time.monotonic() < end:
    conn.sendall(buf)
conn.close()
"""


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def _pair():
    """Two namespaces joined by a veth pair, nothing shaped yet: ((ns, dev, address), (ns, dev, address))."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"mfsh{os.getpid() % 10**6}"
    net = f"198.18.{os.getpid() % 250}"  # the benchmarking range (RFC 2544): never a real peer
    ends = ((tag + "a", tag + "x", f"{net}.1"), (tag + "b", tag + "y", f"{net}.2"))
    try:
        for ns, _dev, _addr in ends:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", ends[0][1], "netns", ends[0][0], "type", "veth", "peer", "name", ends[1][1], "netns",
            ends[1][0])
        for ns, dev, addr in ends:
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        yield ends
    finally:
        for ns, _dev, _addr in ends:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def _shape(ns: str, dev: str, rate: int, queue: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NETFLEET_QUEUE"}
    if queue is not None:
        env["NETFLEET_QUEUE"] = queue
    return subprocess.run([NETFLEET, "shape", ns, dev, str(rate)], env=env, capture_output=True, text=True,
                          check=False)


def _tc(ns: str, *args: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "tc", *args], check=True, capture_output=True,
                          text=True).stdout


def _bulk(sender: tuple, receiver: tuple, seconds: float) -> tuple[int, float]:
    """One TCP flow sender -> receiver for about `seconds`: the bytes that arrived, and over how long (from the
    connection to its end, which comes after the sender stops: what its socket's buffer held still has to cross)."""
    recv = subprocess.Popen(["ip", "netns", "exec", receiver[0], sys.executable, "-c", RECEIVE, receiver[2]],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "listening"
        subprocess.run(["ip", "netns", "exec", sender[0], sys.executable, "-c", SEND, receiver[2], str(seconds)],
                       check=True, timeout=seconds + 30)
        out, _ = recv.communicate(timeout=60)
        n, elapsed = out.split()
        return int(n), float(elapsed)
    finally:
        if recv.poll() is None:
            recv.kill()


def _class_packets(ns: str, dev: str) -> dict[str, tuple[int, int]]:
    """(bytes, packets) each htb class of the interface sent."""
    out = _tc(ns, "-s", "class", "show", "dev", dev)
    return {m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"class htb (1:\d+) .*?\n\s*Sent (\d+) bytes (\d+) pkt", out)}


def test_acks_first_limits_the_rate_and_queues_acknowledgements_apart_from_the_bulk():
    with _pair() as (a, b):
        for ns, dev, _addr in (a, b):
            r = _shape(ns, dev, 8, None)  # the default queue
            assert r.returncode == 0, r.stderr
            assert "qdisc htb 1: root" in _tc(ns, "qdisc", "show", "dev", dev)
        got, elapsed = _bulk(a, b, 3.0)
        # never faster than the link's 8 Mbit/s (htb's burst, 32 KiB, is under 1% of what crossed), and it did
        # carry the flow
        assert 8e6 * 0.3 <= got * 8 / elapsed <= 8e6 * 1.02, (got, elapsed)
        sent_a, sent_b = _class_packets(*a[:2]), _class_packets(*b[:2])
        # a sent the data: the bulk class carried it
        assert sent_a["1:20"][0] >= got * 0.9, sent_a
        # b sent only acknowledgements (and the handshake): in the small packets' class, not behind the bulk (which
        # may hold a few of the interface's own IPv6 packets: the filter takes IPv4 TCP)
        assert sent_b["1:10"][1] >= 100 and sent_b["1:20"][1] * 20 < sent_b["1:10"][1], sent_b


def test_fifo_is_one_tbf_queue_and_a_wrong_queue_name_changes_nothing():
    with _pair() as (a, _b):
        ns, dev, _addr = a
        r = _shape(ns, dev, 8, "fifo")
        assert r.returncode == 0, r.stderr
        before = _tc(ns, "qdisc", "show", "dev", dev)
        assert re.search(r"qdisc tbf \S+ root .*rate 8Mbit", before), before
        r = _shape(ns, dev, 8, "fq")
        assert r.returncode != 0
        assert "NETFLEET_QUEUE=fq: use acks-first (the default) or fifo" in r.stderr
        assert _tc(ns, "qdisc", "show", "dev", dev) == before
        r = subprocess.run([NETFLEET, "shape", ns, dev, "fast"], capture_output=True, text=True, check=False)
        assert r.returncode != 0 and "usage: scripts/netfleet.sh shape NETNS DEV RATE_MBIT" in r.stderr
        assert _tc(ns, "qdisc", "show", "dev", dev) == before
