"""One model across two members (issue 24): real vLLM (CPU) as a pipeline-parallel group of 2, each member started
with the command line modelfleet derives for it (group.members, then vllm_unit.server_argv through the role's
serve launcher) and the member's environment - the head serving HTTP, the other --headless. The members are two
processes on this machine, on two addresses of the documentation range (192.0.2.0/24) added to `lo` for the test:
group.members refuses loopback addresses, as a real group's must be reachable from the other hosts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import group, vllm_unit

from modelfleet.harness.servers import VLLM_VENV, free_port, vllm_env
from tests.conftest import ROOT, lo_addresses

pytestmark = [pytest.mark.integration, pytest.mark.exclusive, pytest.mark.xdist_group("bench")]

LAUNCHER = ROOT / "roles" / "vllm_service" / "files" / "modelfleet-vllm-serve.py"
ADDRESSES = ("192.0.2.71", "192.0.2.72")
PROMPT = "The fleet of hosts"


def _post(url, body, timeout=60):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _greedy(url, model):
    out = _post(url, {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0})
    return out["choices"][0]["text"]


@pytest.fixture
def addresses():
    with lo_addresses(*ADDRESSES) as a:
        yield a


def test_a_pipeline_group_of_two_started_from_the_derived_commands_answers_as_one_host(vllm_server, tiny_model,
                                                                                        addresses, tmp_path):
    port = free_port()
    plan = {"layout": "pp", "nodes": 2, "pipeline_parallel_size": 2}
    members = group.members(plan, [{"host": "m0", "address": addresses[0]}, {"host": "m1", "address": addresses[1]}],
                            http_port=port, group_port=free_port())
    profile = {"served_model_name": "tiny-llama", "vllm": {"max_model_len": 1024}}
    py = str(VLLM_VENV / "bin" / "python")
    procs = []
    try:
        for m in members:
            argv = vllm_unit.server_argv(python=py, model_dir=str(tiny_model), profile=profile, plan=None,
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
        print(f"pipeline group of 2 ready in {ready:.0f} s")
        # the head serves, the headless member holds the second half of the layers: both stages answered it, and
        # greedy decoding gives what one host gives
        assert "--headless" in procs[1][0].args
        assert "pipeline_parallel_size=2" in (tmp_path / "head.log").read_text()
        follower = (tmp_path / "headless.log").read_text()
        assert "headless multiproc executor" in follower and "world_size=2 rank=1" in follower, follower[-3000:]
        assert _greedy(url, "tiny-llama") == _greedy(vllm_server.url, "tiny-llama")
    finally:
        for p, log in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
            log.close()
