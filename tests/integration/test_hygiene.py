"""Stray processes holding the service port (the CPU hosts' path of the zombie logic): reported,
ended only when allowed, TERM then KILL, release confirmed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.hygiene import (
    parse_proc_net_tcp,
    port_holders,
)

from modelfleet.harness.servers import free_port
from tests.conftest import ROOT

STRAY = """
import signal, socket, sys, time
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("listening", flush=True)
time.sleep(600)
"""


@pytest.fixture
def stray(request):
    port = free_port()
    kind = getattr(request, "param", "polite")
    p = subprocess.Popen([sys.executable, "-c", STRAY, str(port), kind], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "listening"
    yield port, p
    if p.poll() is None:
        p.kill()
    p.wait(5)


def hygiene(args):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    r = subprocess.run(["ansible", "localhost", "-c", "local", "-i", "localhost,",
                        "-m", "modelfleet.fleet.gpu_port_hygiene",
                        "-a", json.dumps(args), "-e", f"ansible_python_interpreter={sys.executable}"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    return r.returncode, json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_parse_proc_net_tcp_sees_a_real_listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        rows = parse_proc_net_tcp(open("/proc/net/tcp").read())
        assert any(r["port"] == port and r["state"] == "0A" for r in rows)
        assert [h["pid"] for h in port_holders(port)] == [os.getpid()]
    finally:
        s.close()


def test_stray_is_reported_and_left_alone_by_default(stray):
    port, p = stray
    rc, res = hygiene({"port": port, "check_gpus": False})
    assert rc != 0 and p.poll() is None
    assert "stray process" in res["msg"] and f"pid {p.pid}" in res["msg"] and f"port {port}" in res["msg"]
    assert res["strays"][0]["pid"] == p.pid


def test_allowed_unit_is_not_a_stray(stray):
    port, p = stray
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.hygiene import classify_holders, describe

    d = describe(p.pid)
    assert classify_holders([d], [d["unit"]] if d["unit"] else [], set()) == ([] if d["unit"] else [d])


def test_stray_terminated_when_allowed(stray):
    port, p = stray
    rc, res = hygiene({"port": port, "check_gpus": False, "terminate": True, "grace_seconds": 5})
    assert rc == 0 and res["changed"]
    assert res["terminated"] == {str(p.pid): "TERM"}
    assert p.wait(5) is not None and not port_holders(port)


@pytest.mark.parametrize("stray", ["stubborn"], indirect=True)
def test_stubborn_stray_gets_kill(stray):
    port, p = stray
    t = time.monotonic()
    rc, res = hygiene({"port": port, "check_gpus": False, "terminate": True, "grace_seconds": 1})
    assert rc == 0 and res["terminated"] == {str(p.pid): "KILL"}
    assert time.monotonic() - t >= 1 and not port_holders(port)


def test_nothing_stray(tmp_path):
    rc, res = hygiene({"port": free_port(), "check_gpus": True})
    assert rc == 0 and res["strays"] == [] and res["gpu_reason"].startswith("no NVIDIA driver")
