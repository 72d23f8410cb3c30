"""One model across two members (issue 24): real vLLM (CPU) as a group of 2 - pipeline parallel, and data parallel
with a headless rank - each member started
with the command line modelfleet derives for it (group.members, then vllm_unit.server_argv through the role's
serve launcher) and the member's environment - the head serving HTTP, the other --headless. The members are two
processes on this machine, on two addresses of the documentation range (192.0.2.0/24) added to `lo` for the test:
group.members refuses loopback addresses, as a real group's must be reachable from the other hosts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import group, vllm_unit, watchdog

from modelfleet.harness.servers import VLLM_VENV, reserved_port, vllm_env
from tests.conftest import ROOT, lo_addresses

pytestmark = pytest.mark.integration

LAUNCHER = ROOT / "roles" / "vllm_service" / "files" / "modelfleet-vllm-serve.py"
ADDRESSES = ("192.0.2.71", "192.0.2.72")
DP_ADDRESSES = ("192.0.2.68", "192.0.2.69")
PROMPT = "The fleet of hosts"


def _post(url, body, timeout=60):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _greedy(url, model):
    out = _post(url, {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0})
    return out["choices"][0]["text"]


@contextlib.contextmanager
def _group(layout, model_dir, addresses, tmp_path):
    """The members of a group of two on this machine, each started from the command line modelfleet derives for it
    and its environment; yields (url, members, processes) once the head answers, and kills both after."""
    port = reserved_port()
    plan = {"layout": layout, "nodes": 2, "pipeline_parallel_size": 2 if layout == "pp" else 1}
    members = group.members(plan, [{"host": "m0", "address": addresses[0]}, {"host": "m1", "address": addresses[1]}],
                            http_port=port, group_port=reserved_port())
    profile = {"served_model_name": "tiny-llama", "vllm": {"max_model_len": 1024}}
    py = str(VLLM_VENV / "bin" / "python")
    procs = []
    try:
        for m in members:
            argv = vllm_unit.server_argv(python=py, model_dir=str(model_dir), profile=profile, plan=None,
                                         host="127.0.0.1", port=port, revision=None, member=m,
                                         launcher=str(LAUNCHER))
            env = {**vllm_env(), **m["environment"]}
            env.pop("VLLM_CPU_OMP_THREADS_BIND", None)  # two engines on this machine: neither binds a core
            log = open(tmp_path / f"{m['role']}.log", "w")  # noqa: SIM115 - closed with the process below
            procs.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                           env=env), log))
        url = f"http://127.0.0.1:{port}"
        started, ready = time.monotonic(), None
        while time.monotonic() - started < 600:
            dead = [(m["role"], p.returncode) for m, (p, _l) in zip(members, procs, strict=True)
                    if p.poll() is not None]
            assert not dead, (dead, (tmp_path / "head.log").read_text()[-3000:],
                              (tmp_path / "headless.log").read_text()[-3000:])
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=5).close()
                ready = time.monotonic() - started
                break
            except OSError:
                time.sleep(2)
        assert ready is not None, (tmp_path / "head.log").read_text()[-3000:]
        print(f"{layout} group of 2 ready in {ready:.0f} s")
        yield url, members, [p for p, _l in procs]
    finally:
        for p, log in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
            log.close()


def _process_group_sockets(pgid):
    inodes = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) == pgid:
                inodes |= watchdog.socket_inodes(f"/proc/{pid}/fd")
        except (ProcessLookupError, PermissionError):
            continue
    return inodes


@pytest.mark.exclusive
@pytest.mark.xdist_group("bench")
def test_a_pipeline_group_of_two_started_from_the_derived_commands_answers_as_one_host(vllm_server, tiny_model,
                                                                                        tmp_path):
    with lo_addresses(*ADDRESSES) as addresses, _group("pp", tiny_model, addresses, tmp_path) as (url, members, procs):
        # the head serves, the headless member holds the second half of the layers: both stages answered it, and
        # greedy decoding gives what one host gives
        assert "--headless" in procs[1].args
        assert "pipeline_parallel_size=2" in (tmp_path / "head.log").read_text()
        follower = (tmp_path / "headless.log").read_text()
        assert "headless multiproc executor" in follower and "world_size=2 rank=1" in follower, follower[-3000:]
        assert _greedy(url, "tiny-llama") == _greedy(vllm_server.url, "tiny-llama")
        # the headless member's watchdog probe finds it joined (its store connection to the head's group port)
        cfg = {"head": members[0]["address"], "group_port": members[0]["ports"][0]}
        assert watchdog.follower_joined(watchdog.tcp_tables(), _process_group_sockets(procs[1].pid), cfg)[0]
        # the head dies: the member's connections are left half-closed (CLOSE-WAIT) while it lives on, and the probe
        # says it had joined - its failures count at once, whether or not a look ever saw it joined
        os.killpg(procs[0].pid, signal.SIGKILL)
        deadline, seen = time.monotonic() + 60, None
        while time.monotonic() < deadline and procs[1].poll() is None:
            seen = watchdog.follower_joined(watchdog.tcp_tables(), _process_group_sockets(procs[1].pid), cfg)
            if not seen[0]:
                break
            time.sleep(0.5)
        assert procs[1].poll() is None, "the headless member exited when its head died (the watchdog rule assumes not)"
        assert seen is not None and seen[0] is False and seen[2] is True, seen
        assert seen[1].startswith("left: the head "), seen


def test_a_data_parallel_group_with_a_headless_rank_serves_from_both_ranks(tiny_model, tmp_path):
    """Data parallel (a whole copy per host, one API at the head, the other rank --headless): both ranks answer
    requests, identically at temperature 0, and the headless rank's watchdog probe finds it joined although it holds
    no connection to the group's (rpc) port once the group is up - only to ports the head picked at start."""
    with lo_addresses(*DP_ADDRESSES) as addresses, _group("dp", tiny_model, addresses, tmp_path) as (url, members,
                                                                                                    procs):
        assert "--data-parallel-start-rank" in procs[1].args and "--headless" in procs[1].args
        answers = {_greedy(url, "tiny-llama") for _ in range(8)}
        assert len(answers) == 1, answers
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        served = {}
        for line in metrics.splitlines():
            if line.startswith("vllm:request_success_total{"):
                engine = line.split('engine="', 1)[1].split('"', 1)[0]
                served[engine] = served.get(engine, 0) + float(line.rsplit(" ", 1)[1])
        assert set(served) == {"0", "1"} and all(n > 0 for n in served.values()), served
        assert sum(served.values()) >= 8, served
        head, rpc_port = members[0]["address"], members[0]["ports"][0]
        inodes = _process_group_sockets(procs[1].pid)
        tables = watchdog.tcp_tables()
        joined, said, _had = watchdog.follower_joined(tables, inodes, {"head": head, "group_port": rpc_port})
        assert joined, said
        print(f"data parallel: requests per engine {served}; the headless rank holds a connection to its rpc port: "
              f"{watchdog.holds_connection(tables, inodes, head, rpc_port)}")
