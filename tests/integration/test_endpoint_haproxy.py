"""The fleet endpoint's configuration run by the real HAProxy (as modelfleet-endpoint.service runs it, without
systemd) in front of two small HTTP servers on loopback that answer like vLLM's completion route: the replica that
answers the check takes requests and says so in X-Modelfleet-Replica, the client's Authorization header reaches
it untouched, one that refuses connections is DOWN with the balancer's reason, and a replica that starts
answering joins. The real vLLM behind the real endpoint is molecule/fleet's (tests/test_fleet.py)."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import endpoint

from modelfleet.harness.servers import reserved_port
from tests.conftest import ansible_module

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def _answer(handler, status, body):
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _Replica(http.server.BaseHTTPRequestHandler):
    seen: list = []
    slow_prompt = "slow"  # a client request with this prompt takes 2 s (one held while its replica is drained)

    def do_POST(self):  # noqa: N802 - the stdlib's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.seen.append({"auth": self.headers.get("Authorization"), "model": body.get("model")})
        if body.get("prompt") == self.slow_prompt:
            time.sleep(2)
        ok = body.get("model") == "tiny"
        _answer(self, 200 if ok else 404,
                json.dumps({"object": "text_completion"} if ok else {"error": "no such model"}).encode())

    def log_message(self, *args):
        pass


def _serve(port):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Replica)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _wait(cond, timeout=20):
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s")


@pytest.fixture
def balancer(tmp_path):
    assert os.path.exists(HAPROXY), "haproxy is not installed (scripts/setup.sh installs it)"
    up, later, front = reserved_port(), reserved_port(), reserved_port()
    srv = _serve(up)
    fe = {"name": "tiny", "port": front, "served_name": "tiny", "api_key": "k3y", "left_out": [],
          "backends": [{"name": "r1", "address": "127.0.0.1", "port": up},
                       {"name": "r2", "address": "127.0.0.1", "port": later}]}
    sock = str(tmp_path / "admin.sock")
    cfg = str(tmp_path / "haproxy.cfg")
    text = endpoint.render([fe], bind_address="127.0.0.1", check_interval=0.5, check_timeout=2, user=None,
                           admin_socket=sock)
    assert endpoint.install(cfg, text, haproxy=HAPROXY)[0]
    proc = subprocess.Popen([HAPROXY, "-db", "-f", cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: os.path.exists(sock))
        yield {"front": front, "later": later, "sock": sock, "proc": proc}
    finally:
        proc.terminate()
        proc.wait(10)
        srv.shutdown()


def _complete(front, key="Bearer client-key", prompt="x"):
    req = urllib.request.Request(f"http://127.0.0.1:{front}/v1/completions", method="POST",
                                 data=json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 1}).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": key})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.headers.get("X-Modelfleet-Replica")


def _complete_in_two_writes(front, prompt, pad=0):
    """A completion whose headers and body leave in two writes, 0.2 s apart, as many clients send them (Python's
    http.client writes them apart too, but then only the timing decides whether the balancer sees them apart).
    Returns (status, replica) or the exception's text: it runs in a thread, where a raise would be lost."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 1, "user": "u" * pad}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", front, timeout=20)
    try:
        conn.putrequest("POST", "/v1/completions")
        for k, v in (("Content-Type", "application/json"), ("Authorization", "Bearer client-key"),
                     ("Content-Length", str(len(body)))):
            conn.putheader(k, v)
        conn.endheaders()
        time.sleep(0.2)
        conn.send(body)
        r = conn.getresponse()
        r.read()
        return r.status, r.getheader("X-Modelfleet-Replica")
    except OSError as e:
        return repr(e)
    finally:
        conn.close()


def test_the_replica_that_answers_the_check_takes_requests_and_the_other_is_down_with_the_reason(balancer):
    states = _wait(lambda: (s := endpoint.server_states(balancer["sock"]))["tiny"]["r1"]["status"] == "UP"
                   and s["tiny"]["r2"]["check"].startswith("L4") and s)
    assert states["tiny"]["r2"]["status"].startswith("DOWN"), states
    (why,) = endpoint.not_up(states, {"tiny": ["r1", "r2"]})
    assert why.startswith("tiny/r2: DOWN, last check L4CON") and "connection refused" in why
    _Replica.seen.clear()
    assert [_complete(balancer["front"]) for _ in range(4)] == [(200, "r1")] * 4
    # the checks carry the endpoint's key; the clients' requests carry their own, untouched
    clients = [s for s in _Replica.seen if s["auth"] == "Bearer client-key"]
    assert len(clients) == 4 and all(s["model"] == "tiny" for s in clients)
    assert {s["auth"] for s in _Replica.seen} <= {"Bearer client-key", "Bearer k3y"}


def test_a_replica_that_starts_answering_joins_and_takes_its_share(balancer):
    srv = _serve(balancer["later"])
    try:
        _wait(lambda: endpoint.not_up(endpoint.server_states(balancer["sock"]), {"tiny": ["r1", "r2"]}) == [])
        answered = {_complete(balancer["front"])[1] for _ in range(8)}
        assert answered == {"r1", "r2"}
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_drained_replica_finishes_what_it_holds_takes_nothing_new_and_comes_back(balancer):
    """Drain before stop (vllm_service around a switch, module endpoint_server): maint sends the replica no new
    request and stops its checks while the request it holds finishes; ready brings it back after a passed check."""
    srv = _serve(balancer["later"])
    sock = balancer["sock"]
    try:
        _wait(lambda: endpoint.not_up(endpoint.server_states(sock), {"tiny": ["r1", "r2"]}) == [])
        held = []
        # a slow request on r2 (leastconn with both idle: send until one lands on r2, then drain r2 during it)
        while not held:
            t = threading.Thread(target=lambda: held.append(_complete(balancer["front"], prompt="slow")))
            t.start()
            time.sleep(0.3)
            if endpoint.server_states(sock)["tiny"]["r2"]["current"] == 1:
                break
            t.join()
            held.clear()
        change = endpoint.set_state("tiny", "r2", "maint", sock)
        assert change["before"]["status"] == "UP" and change["after"]["status"].startswith("MAINT")
        answers = [_complete(balancer["front"]) for _ in range(6)]
        assert answers == [(200, "r1")] * 6  # nothing new for r2 ...
        t.join()
        assert held == [(200, "r2")]  # ... and what it held came back whole
        endpoint.set_state("tiny", "r2", "ready", sock)
        _wait(lambda: endpoint.server_states(sock)["tiny"]["r2"]["status"] == "UP")
        assert {_complete(balancer["front"])[1] for _ in range(8)} == {"r1", "r2"}
    finally:
        srv.shutdown()
        srv.server_close()


# the replica that is killed runs in a process of its own (the in-process ones above cannot be)
_KILLABLE = """
import http.server, json, sys, time
class R(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if body.get("prompt") == "slow":
            time.sleep(30)
        out = json.dumps({"object": "text_completion"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), R).serve_forever()
"""


@pytest.mark.parametrize("pad", [0, 100_000], ids=["small", "100KB"])
def test_a_replica_killed_while_it_holds_a_request_leaves_at_once_and_the_request_is_answered(tmp_path, pad):
    """kill -9 of a replica's process: the request it held (no answer started) is sent again to the other one, and
    the first connection that fails takes the replica out of the endpoint at once - the checks here run every
    60 s, so only the balancer's watch of live traffic (observe layer4, on-error mark-down) explains it.
    The held request's headers and body come in two writes: HAProxy keeps a request to send again only when it
    had the whole of it before forwarding any (option http-buffer-request); without that it answered 502. The
    copy is one HAProxy buffer: a 100 KB request (a long prompt) is kept too (retry_request_kib, 256 by default;
    with HAProxy's own 16 KiB it got the 502)."""
    p1, p2, front = reserved_port(), reserved_port(), reserved_port()
    srv = _serve(p1)
    victim = subprocess.Popen([sys.executable, "-c", _KILLABLE, str(p2)])
    sock, cfg = str(tmp_path / "admin.sock"), str(tmp_path / "haproxy.cfg")
    fe = {"name": "tiny", "port": front, "served_name": "tiny", "left_out": [],
          "backends": [{"name": "r1", "address": "127.0.0.1", "port": p1},
                       {"name": "r2", "address": "127.0.0.1", "port": p2}]}
    proc = None
    try:
        _wait(lambda: socket.socket().connect_ex(("127.0.0.1", p2)) == 0)
        assert endpoint.install(cfg, endpoint.render([fe], bind_address="127.0.0.1", check_interval=60,
                                                     check_timeout=2, user=None, admin_socket=sock), HAPROXY)[0]
        proc = subprocess.Popen([HAPROXY, "-db", "-f", cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        _wait(lambda: os.path.exists(sock) and endpoint.not_up(endpoint.server_states(sock),
                                                                {"tiny": ["r1", "r2"]}) == [])
        held = []
        while not held:  # leastconn: send slow requests until one is held by r2
            t = threading.Thread(target=lambda: held.append(_complete_in_two_writes(front, "slow", pad)))
            t.start()
            time.sleep(0.5)
            if endpoint.server_states(sock)["tiny"]["r2"]["current"] == 1:
                break
            t.join()
            held.clear()
        killed = time.monotonic()
        victim.kill()
        victim.wait(10)
        t.join(20)
        assert held == [(200, "r1")]  # what r2 held was answered by r1
        answers = []
        while not endpoint.server_states(sock)["tiny"]["r2"]["status"].startswith("DOWN") and len(answers) < 10:
            answers.append(_complete(front))
        left = time.monotonic() - killed
        assert endpoint.server_states(sock)["tiny"]["r2"]["status"].startswith("DOWN") and left < 30, left
        assert set(answers) <= {(200, "r1")}  # a request routed to the dead replica was redispatched, not failed
    finally:
        for p in (victim, proc):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
        srv.shutdown()
        srv.server_close()


def test_the_modules_drain_a_replica_and_wait_for_the_balancers_view(balancer):
    """The module shells the roles call, run by Ansible against the real HAProxy: endpoint_server maint (then its
    second call changes nothing), endpoint_status failing with the balancer's reason while a replica is out and
    passing once both are UP, endpoint_server ready waiting until the replica is UP again, and vllm_idle's bounded
    wait on a server that holds requests. The wait loop itself is tests/unit/test_poll.py."""
    srv = _serve(balancer["later"])
    sock = balancer["sock"]
    args = {"endpoint": "tiny", "replica": "r2", "admin_socket": sock, "wait_seconds": 10}
    both = [{"name": "tiny", "backends": [{"name": "r1"}, {"name": "r2"}]}]
    try:
        _wait(lambda: endpoint.not_up(endpoint.server_states(sock), {"tiny": ["r1", "r2"]}) == [])
        rc, res, out = ansible_module("endpoint_server", dict(args, state="maint"))
        assert rc == 0 and res["changed"] and res["after"]["status"].startswith("MAINT"), out
        assert res["after"]["current"] == 0 and res["waited_seconds"] < 10
        rc, res, out = ansible_module("endpoint_server", dict(args, state="maint"))
        assert rc == 0 and not res["changed"] and "already MAINT" in res["msg"], out
        rc, res, out = ansible_module("endpoint_status", {"admin_socket": sock, "frontends": both,
                                                          "wait_seconds": 1})
        assert rc != 0 and "does not send requests to every replica" in res["msg"] and "tiny/r2: MAINT" in \
            res["msg"], out
        rc, res, out = ansible_module("endpoint_server", dict(args, state="ready"))
        assert rc == 0 and res["changed"] and res["up"] and res["after"]["status"] == "UP", out
        rc, res, out = ansible_module("endpoint_status", {"admin_socket": sock, "frontends": both,
                                                          "wait_seconds": 10})
        assert rc == 0 and res["states"]["tiny"]["r2"]["status"] == "UP", out
    finally:
        srv.shutdown()
        srv.server_close()
    # a "server" whose gauges say it holds a request: vllm_idle waits its whole bound and says so
    holding = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    threading.Thread(target=holding.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{holding.server_address[1]}"
        rc, res, out = ansible_module("vllm_idle", {"urls": [url], "timeout_seconds": 1.5})
        assert rc == 0 and res["idle"] is False and res["in_flight"] == {url: 3} and 1.5 <= res["waited_seconds"] < 5
        _Busy.running = 0
        rc, res, out = ansible_module("vllm_idle", {"urls": [url], "timeout_seconds": 30})
        assert rc == 0 and res["idle"] is True and res["waited_seconds"] < 5, out
    finally:
        holding.shutdown()
        holding.server_close()


class _Busy(http.server.BaseHTTPRequestHandler):
    running = 3

    def do_GET(self):  # noqa: N802 - the stdlib's name
        _answer(self, 200, (f'vllm:num_requests_running{{model_name="tiny"}} {self.running}.0\n'
                            'vllm:num_requests_waiting{model_name="tiny"} 0.0\n').encode())

    def log_message(self, *args):
        pass


def test_setting_a_replica_the_balancer_does_not_know_says_so(balancer):
    with pytest.raises(endpoint.EndpointError, match="the endpoint has no replica tiny/r9"):
        endpoint.set_state("tiny", "r9", "maint", balancer["sock"])
    with pytest.raises(endpoint.EndpointError, match="state 'down': maint or ready"):
        endpoint.set_state("tiny", "r1", "down", balancer["sock"])
