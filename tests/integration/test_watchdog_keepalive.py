"""A head host that loses power closes nothing, and an idle group sends nothing: vLLM sets no TCP keepalive, so a
headless member's connections to its head stay ESTABLISHED and its watchdog would see it joined forever. The
watchdog turns keepalive on for those connections from outside the member's processes (watchdog.keep_alive).
Real sockets across a veth pair into a network namespace (the head's host); the head's end of the link is set
down, as a host that lost power: nothing is sent back, no close, no reset."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import watchdog as wd

pytestmark = pytest.mark.integration

HEAD = """
import socket, sys, time
srv = socket.create_server((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
held = [srv.accept()[0] for _ in range(2)]
time.sleep(300)
"""
MEMBER = """
import socket, sys, time
held = [socket.create_connection((sys.argv[1], int(sys.argv[2]))) for _ in range(2)]
print("joined", flush=True)
time.sleep(300)
"""


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def _head_host():
    """A namespace behind a veth pair: (namespace, its end of the link, this side's address, its address)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"mfka{os.getpid() % 10**6}"
    ns, near, far = tag, tag + "n", tag + "f"
    net = f"198.18.{os.getpid() % 250}"  # the benchmarking range (RFC 2544): never a real peer
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", near, "type", "veth", "peer", "name", far, "netns", ns)
        _ip("addr", "add", f"{net}.1/30", "dev", near)
        _ip("link", "set", near, "up")
        _ip("-n", ns, "addr", "add", f"{net}.2/30", "dev", far)
        _ip("-n", ns, "link", "set", far, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        yield ns, far, f"{net}.1", f"{net}.2"
    finally:
        subprocess.run(["ip", "link", "del", near], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def test_keepalive_set_from_outside_drops_a_connection_to_a_head_host_gone_silent():
    with _head_host() as (ns, far, _near_addr, head_addr), contextlib.ExitStack() as stack:
        head = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", HEAD, head_addr],
                                stdout=subprocess.PIPE, text=True)
        stack.callback(head.wait, 10)
        stack.callback(head.kill)
        port = int(head.stdout.readline())
        member = subprocess.Popen([sys.executable, "-c", MEMBER, head_addr, str(port)], stdout=subprocess.PIPE,
                                  text=True)
        stack.callback(member.wait, 10)
        stack.callback(member.kill)
        assert member.stdout.readline().strip() == "joined"
        socks = wd.socket_fds(f"/proc/{member.pid}/fd")
        established = sorted(wd.connections(wd.tcp_tables(), set(socks), head_addr, port))
        assert len(established) == 2, established
        kept, bare = established
        assert wd.keepalive_timers(wd.tcp_tables(), set(established)) == set()  # as vLLM leaves them
        wd.keep_alive(member.pid, socks[kept], idle=1, interval=1, count=2)
        assert wd.keepalive_timers(wd.tcp_tables(), set(established)) == {kept}
        _ip("-n", ns, "link", "set", far, "down")  # the head's host loses power: nothing comes back
        t0 = time.monotonic()
        while kept in wd.connections(wd.tcp_tables(), {kept}, head_addr) and time.monotonic() - t0 < 30:
            time.sleep(0.2)
        gone = time.monotonic() - t0
        tables = wd.tcp_tables()
        assert kept not in wd.connections(tables, {kept}, head_addr), "keepalive did not drop the dead connection"
        # without keepalive the member still looks joined to a head that is gone - what the watchdog would see
        assert wd.connections(tables, {bare}, head_addr, port) == {bare}
        assert member.poll() is None  # the member's process and its fd are untouched
        print(f"a connection with keepalive (idle 1 s, interval 1 s, 2 probes) left ESTABLISHED {gone:.1f} s after "
              "its head's host went silent; the one without is still ESTABLISHED")
