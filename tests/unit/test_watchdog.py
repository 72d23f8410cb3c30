"""The liveness watchdog's rule (watchdog.decide) and its glue run against a real HTTP server that answers /health
while its completions hang - the failure vLLM shows when its engine stops."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import readiness
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import watchdog as wd

from tests.conftest import ROOT

UP = {"active": True, "invocation": "a1", "active_seconds": 1000.0}


def run(states, unit=UP, probes=(), failures=3, grace=600.0):
    """Feed probes in order to decide; returns the actions and the last state."""
    state, actions = dict(states), []
    for probe in probes:
        state, act = wd.decide(state, unit, None, failures, grace)
        assert act == "probe"
        state, act = wd.decide(state, unit, probe, failures, grace)
        actions.append(act)
    return actions, state


def test_restart_only_after_the_set_number_of_failures_in_a_row():
    bad = (False, "listed: completion: timed out")
    actions, state = run({}, probes=[bad, bad, (True, ""), bad, bad, bad])
    assert actions == ["none", "none", "none", "none", "none", "restart"]
    assert state["failures"] == 3 and state["last_failure"] == bad[1]


def test_a_starting_unit_is_not_failing_until_its_grace_is_spent():
    young = dict(UP, active_seconds=30.0)
    bad = (False, "down: /health: connection refused")
    assert run({}, unit=young, probes=[bad] * 5)[0] == ["none"] * 5
    old = dict(UP, active_seconds=601.0)
    assert run({}, unit=old, probes=[bad] * 3)[0] == ["none", "none", "restart"]


def test_once_it_answered_a_young_unit_counts_its_failures():
    young = dict(UP, active_seconds=30.0)
    bad = (False, "listed: completion: timed out")
    assert run({}, unit=young, probes=[(True, ""), bad, bad, bad])[0] == ["none", "none", "none", "restart"]


def test_proof_that_a_young_unit_had_joined_counts_its_failures_within_its_grace():
    """A headless member restarted under load can join the old head and lose it between two looks: no look saw it
    joined, but the connection the head closed proves it was - it is out of its group, not starting."""
    young = dict(UP, active_seconds=30.0)
    never = (False, "not joined: no connection to the head", False)
    assert run({}, unit=young, probes=[never] * 4)[0] == ["none"] * 4
    left = (False, "left: the head closed its connection", True)
    actions, state = run({}, unit=young, probes=[never, left, left], failures=2)
    assert actions == ["none", "none", "restart"] and state["answered"] and state["last_failure"] == left[1]


def test_a_new_start_forgets_the_old_ones_failures_and_an_inactive_unit_is_left_alone():
    bad = (False, "x")
    _actions, state = run({}, probes=[bad, bad])
    assert state["failures"] == 2
    restarted = dict(UP, invocation="b2", active_seconds=5.0)
    state, act = wd.decide(state, restarted, None, 3, 600)
    assert (act, state["failures"], state["answered"]) == ("probe", 0, False)
    state, act = wd.decide(state, dict(UP, active=False), None, 3, 600)
    assert act == "none" and state["failures"] == 0


def test_a_paused_unit_is_not_probed_and_keeps_its_failures(tmp_path):
    _actions, state = run({}, probes=[(False, "x")])
    state, act = wd.decide(state, UP, None, 3, 600, paused=True)
    assert act == "none" and state["failures"] == 1
    unit = "modelfleet-vllm@tiny.service"
    assert not wd.paused(unit, str(tmp_path))
    (tmp_path / unit).write_text("1000")
    assert wd.paused(unit, str(tmp_path), now=999) and not wd.paused(unit, str(tmp_path), now=1000)
    (tmp_path / unit).write_text("not a time")
    assert not wd.paused(unit, str(tmp_path), now=0)


class _Engine(BaseHTTPRequestHandler):
    hang = threading.Event()

    def log_message(self, *a):
        pass

    def _send(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send({"data": [{"id": "tiny"}]})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.hang.is_set():
            time.sleep(3)  # the engine answers nothing within the watchdog's timeout
            return
        self._send({"choices": [{"text": "x"}]})


@pytest.fixture
def engine():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Engine.hang.clear()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    _Engine.hang.clear()
    srv.shutdown()


def test_check_restarts_a_unit_whose_health_answers_while_completions_hang(engine, tmp_path, monkeypatch):
    calls = []

    def fake_run(argv, **kw):  # systemctl: the unit is up since invocation a1; record a restart
        calls.append(argv)
        out = "ActiveState=active\nInvocationID=a1\nActiveEnterTimestampMonotonic=1\n" if argv[1] == "show" else ""
        return type("R", (), {"stdout": out, "stderr": "", "returncode": 0})()

    monkeypatch.setattr(wd.subprocess, "run", fake_run)
    cfg = {"unit": "modelfleet-vllm@tiny.service", "url": engine, "served_name": "tiny", "env_file": "/nonexistent",
           "timeout": 1, "failures": 2, "grace": 0}
    said = []
    pause = tmp_path / "pause"
    pause.mkdir()
    assert wd.check(cfg, str(tmp_path), readiness.look, said.append, pause_dir=str(pause)) == "none"  # answering
    _Engine.hang.set()
    assert wd.check(cfg, str(tmp_path), readiness.look, said.append, pause_dir=str(pause)) == "none"
    (pause / cfg["unit"]).write_text(str(time.time() + 600))  # a benchmark measures it: not probed, not restarted
    looks = [wd.check(cfg, str(tmp_path), readiness.look, said.append, pause_dir=str(pause)) for _ in range(3)]
    assert looks == ["none"] * 3
    assert len(said) == 1
    (pause / cfg["unit"]).unlink()
    assert wd.check(cfg, str(tmp_path), readiness.look, said.append, pause_dir=str(pause)) == "restart"
    assert ["systemctl", "restart", "--no-block", cfg["unit"]] in calls
    assert "restarting: 2 real completions failed in a row" in said[-1] and "timed out" in said[-1]
    state = json.loads((tmp_path / f"{cfg['unit']}.json").read_text())
    assert state["failures"] == 0 and "timed out" in state["last_restart"]["reason"]


def test_the_host_entry_point_runs_without_ansible_and_restarts_a_hung_unit(engine, tmp_path):
    """roles/vllm_service/files/modelfleet-watchdog.py as the host runs it: the system's python3 (no Ansible), the
    module_utils files copied beside it, systemctl first on PATH (here a recording stand-in: this machine has no
    systemd; molecule/fleet runs the real one)."""
    import shutil
    import subprocess
    import sys

    py = shutil.which("python3", path="/usr/bin") or sys.executable
    code = tmp_path / "opt"
    code.mkdir()
    utils = ROOT / "plugins/module_utils/modelfleet"
    entry = ROOT / "roles/vllm_service/files/modelfleet-watchdog.py"
    for src in (entry, utils / "watchdog.py", utils / "readiness.py"):
        shutil.copy(src, code)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\necho \"$*\" >> %s\n[ \"$1\" = show ] && printf "
                                       "'ActiveState=active\\nInvocationID=a1\\nActiveEnterTimestampMonotonic=1\\n'\n"
                                       "exit 0\n" % (tmp_path / "calls"))
    (bin_dir / "systemctl").chmod(0o755)
    conf = tmp_path / "conf"
    conf.mkdir()
    unit = "modelfleet-vllm@tiny.service"
    (conf / "tiny.json").write_text(json.dumps({"unit": unit, "url": engine, "served_name": "tiny", "env_file": "/none",
                                                "timeout": 1, "failures": 2, "grace": 0}))
    (conf / "broken.json").write_text("[1, 2]")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STATE_DIRECTORY": str(tmp_path / "state")}
    _Engine.hang.set()
    runs = [subprocess.run([py, "-I", str(code / "modelfleet-watchdog.py"), str(conf)], env=env, capture_output=True,
                           text=True, timeout=60) for _ in range(2)]
    assert [r.returncode for r in runs] == [1, 1]  # the broken description is named, the good one still watched
    assert "broken.json: not a watchdog description" in runs[0].stderr and "Traceback" not in runs[0].stderr
    assert "failed (1 of 2 in a row)" in runs[0].stdout
    assert f"{unit}: restarting: 2 real completions failed in a row" in runs[1].stdout
    assert f"restart --no-block {unit}" in (tmp_path / "calls").read_text()


# A headless member of a multi-host group: its probe is the connection its unit's processes hold to the head's
# group port. Real sockets of this process, read back from the real /proc.

def _tables():
    return wd.tcp_tables()


def _own_inodes():
    return wd.socket_inodes("/proc/self/fd")


@pytest.mark.parametrize("family", ["ipv4", "ipv4-mapped"])
def test_a_held_connection_to_the_head_is_seen_and_a_closed_one_is_not(family):
    import socket

    if family == "ipv4":
        srv = socket.create_server(("127.0.0.1", 0))
        cli = socket.create_connection(("127.0.0.1", srv.getsockname()[1]))
    else:  # a dual-stack listener and an IPv6 client: /proc/net/tcp6 names the head ::ffff:127.0.0.1
        srv = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        cli = socket.socket(socket.AF_INET6)
        cli.connect(("::ffff:127.0.0.1", srv.getsockname()[1]))
    port = srv.getsockname()[1]
    conn, _ = srv.accept()
    try:
        assert wd.holds_connection(_tables(), _own_inodes(), "127.0.0.1", port)
        assert wd.holds_connection(_tables(), _own_inodes(), "127.0.0.1")  # any port of the head
        assert not wd.holds_connection(_tables(), _own_inodes(), "127.0.0.1", port + 1 if port < 65535 else 1024)
        assert not wd.holds_connection(_tables(), _own_inodes(), "192.0.2.1", port)
        assert not wd.holds_connection(_tables(), _own_inodes(), "192.0.2.1")
        # only the unit's own sockets count: without the client's, what is left (the listener, the accepted side)
        # does not point to the head's port
        assert not wd.holds_connection(_tables(), _own_inodes() - {_inode_of(cli)}, "127.0.0.1", port)
        assert not wd.holds_connection(_tables(), _own_inodes(), "127.0.0.1", port, state=wd.CLOSE_WAIT)
        cfg, ino = {"head": "127.0.0.1", "group_port": port}, _inode_of(cli)
        assert wd.follower_joined(_tables(), {ino}, cfg)[::2] == (True, True)
        conn.close()  # the head stops: the member's side leaves ESTABLISHED (CLOSE-WAIT)
        srv.close()
        deadline = time.monotonic() + 5
        while wd.holds_connection(_tables(), _own_inodes(), "127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not wd.holds_connection(_tables(), _own_inodes(), "127.0.0.1", port)
        assert not wd.holds_connection(_tables(), {ino}, "127.0.0.1")
        assert wd.holds_connection(_tables(), {ino}, "127.0.0.1", port, state=wd.CLOSE_WAIT)
        joined, said, had_joined = wd.follower_joined(_tables(), {ino}, cfg)
        assert (joined, had_joined) == (False, True) and said.startswith("left: the head 127.0.0.1 closed"), said
        cli.close()  # the member closes its side too: nothing is left to prove it had joined
        assert wd.follower_joined(_tables(), {ino}, cfg)[::2] == (False, False)
    finally:
        cli.close()


def _inode_of(sock):
    import os

    return os.fstat(sock.fileno()).st_ino


def test_a_member_without_its_head_is_restarted_after_the_set_number_of_looks(tmp_path, monkeypatch):
    """check() for a headless member: joined while its unit's processes hold the connection; once the head is gone,
    `failures` looks in a row restart it. The unit's processes are found by their cgroup in a /proc tree (here a
    copy naming this process's real socket under the unit's cgroup, beside a process of another unit holding the
    same connection, which must not count)."""
    import os
    import socket

    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    unit = "modelfleet-vllm@tiny.service"
    proc = tmp_path / "proc"
    # the unit's holder of the connection is this process (its pid, the client's fd): the watchdog's keepalive is
    # set on the real socket
    me, ino = str(os.getpid()), _inode_of(cli)
    for pid, cgroup, fd, inode in ((me, f"/system.slice/system-x.slice/{unit}", cli.fileno(), ino),
                                   ("102", f"/system.slice/{unit}/worker", 3, 999999999),  # a sub-cgroup of the unit
                                   ("103", "/system.slice/other.service", 3, ino)):
        (proc / pid / "fd").mkdir(parents=True)
        (proc / pid / "cgroup").write_text(f"0::{cgroup}\n")
        os.symlink(f"socket:[{inode}]", proc / pid / "fd" / str(fd))
    (proc / "self").mkdir()
    assert wd.unit_socket_inodes(unit, proc=str(proc)) == {ino, 999999999}
    assert wd.unit_sockets(unit, proc=str(proc)) == {ino: (os.getpid(), cli.fileno()), 999999999: (102, 3)}
    assert wd.unit_socket_inodes("other.service", proc=str(proc)) == {ino}
    assert wd.unit_socket_inodes("tiny.service", proc=str(proc)) == set()  # a name's tail is not the unit
    calls = []

    started = int(time.monotonic() * 1e6)  # the unit became active just now: well inside its grace

    def fake_run(argv, **kw):
        calls.append(argv)
        out = (f"ActiveState=active\nInvocationID=b1\nActiveEnterTimestampMonotonic={started}\n"
               if argv[1] == "show" else "")
        return type("R", (), {"stdout": out, "stderr": "", "returncode": 0})()

    real_sockets = wd.unit_sockets
    monkeypatch.setattr(wd.subprocess, "run", fake_run)
    monkeypatch.setattr(wd, "unit_sockets", lambda u: real_sockets(u, proc=str(proc)))
    # the start budget (grace) is long: a member no look has seen joined is starting - unless the head closed on it
    cfg = {"unit": unit, "head": "127.0.0.1", "group_port": port, "failures": 2, "grace": 900}
    said = []
    pause, seen, unseen, never = (tmp_path / d for d in ("pause", "seen", "unseen", "never"))
    for d in (pause, seen, unseen, never):
        d.mkdir()
    try:
        assert wd.keepalive_timers(_tables(), {ino}) == set()  # a new connection: no keepalive (vLLM sets none)
        assert wd.check(cfg, str(seen), None, said.append, pause_dir=str(pause)) == "none"  # a look sees it joined
        assert said == [] and json.loads((seen / f"{unit}.json").read_text())["answered"]
        # ... and turned keepalive on for the member's connection to the head, on the socket itself
        assert cli.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert cli.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == wd.KEEPALIVE["idle"]
        assert cli.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == wd.KEEPALIVE["count"]
        assert wd.keepalive_timers(_tables(), {ino}) == {ino}
        assert not conn.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)  # the head's side is not the unit's
        conn.close()
        srv.close()
        time.sleep(0.2)
        # with that look (seen) and without it (unseen, a member that joined and lost its head between two looks):
        # out of its group either way, restarted at the second look
        for state_dir in (seen, unseen):
            said.clear()
            assert wd.check(cfg, str(state_dir), None, said.append, pause_dir=str(pause)) == "none"
            assert "1 of 2 in a row" in said[-1] and "left: the head 127.0.0.1 closed its connection" in said[-1]
            assert wd.check(cfg, str(state_dir), None, said.append, pause_dir=str(pause)) == "restart"
            assert "2 looks in a row found it out of its group" in said[-1]
        assert calls.count(["systemctl", "restart", "--no-block", unit]) == 2
        # no connection at all (the member closed its side, or never connected): starting, within its grace
        cli.close()
        said.clear()
        assert [wd.check(cfg, str(never), None, said.append, pause_dir=str(pause))
                for _ in range(3)] == ["none"] * 3
        assert said == []
    finally:
        cli.close()


def test_a_member_whose_keepalive_cannot_be_set_is_still_judged_and_says_why_once(tmp_path, monkeypatch):
    """Without CAP_SYS_PTRACE (or with the holder gone) keepalive cannot be set: the look still judges the member
    joined, and the cause is said once, not at every look."""
    import os
    import socket

    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(("127.0.0.1", srv.getsockname()[1]))
    conn, _ = srv.accept()
    unit = "modelfleet-vllm@tiny.service"
    sockets = {_inode_of(cli): (os.getpid(), cli.fileno())}

    def refused(*_a, **_k):
        raise PermissionError(1, "Operation not permitted")

    started = int(time.monotonic() * 1e6)
    monkeypatch.setattr(wd, "unit_sockets", lambda u: sockets)
    monkeypatch.setattr(wd, "keep_alive", refused)
    monkeypatch.setattr(wd.subprocess, "run", lambda argv, **kw: type("R", (), {
        "stdout": f"ActiveState=active\nInvocationID=b1\nActiveEnterTimestampMonotonic={started}\n",
        "stderr": "", "returncode": 0})())
    cfg = {"unit": unit, "head": "127.0.0.1", "group_port": srv.getsockname()[1], "failures": 2, "grace": 900}
    said = []
    try:
        for _ in range(3):
            assert wd.check(cfg, str(tmp_path), None, said.append, pause_dir=str(tmp_path)) == "none"
        assert len(said) == 1 and "could not turn TCP keepalive on" in said[0] and "Operation not permitted" in said[0]
        assert json.loads((tmp_path / f"{unit}.json").read_text())["answered"]
        assert not cli.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
    finally:
        for s in (cli, conn, srv):
            s.close()
