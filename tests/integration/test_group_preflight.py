"""Issue 24: a multi-host group is deployed as one. The vllm_service role's preflight (its first task, before
anything is computed, stopped or written) refuses a host that is not one of vllm_service_group_members, and a
group one of whose members is not in the run (failed earlier or not targeted), naming the members and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import group

from tests.conftest import ROOT, lo_addresses

pytestmark = [pytest.mark.integration]

PLAN = {"layout": "pp", "nodes": 2, "pipeline_parallel_size": 2}


def _run(tmp_path, members, hosts=("localhost",), **extra_vars):
    """The role's preflight on `hosts` (each a local connection on this machine), as one play."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {"hosts": {h: {} for h in hosts}, "vars": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}))
    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{
        "hosts": "all", "gather_facts": False,
        "tasks": [{"name": "Preflight of a group member", "ansible.builtin.include_role": {
            "name": "modelfleet.fleet.vllm_service", "tasks_from": "preflight"}}],
        "vars": {"vllm_service_group_members": members, "vllm_service_model_dir": str(tmp_path / "model"),
                 "vllm_service_profile": {"served_model_name": "tiny", "repo_id": "x/tiny",
                                          "vllm": {"max_model_len": 1024}}, **extra_vars}}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    r = subprocess.run(["ansible-playbook", "-i", str(inv), str(play)], capture_output=True, text=True, env=env,
                       timeout=180)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("hosts, needles", [
    (["ghost-1", "ghost-2"], ["this host is not a member of vllm_service_group_members (ghost-1, ghost-2)",
                              "group_members filter"]),
    (["localhost", "ghost-2"], ["the group's members ghost-2 are not in this run",
                                "a group is deployed as one, so nothing was stopped or changed here"]),
])
def test_a_group_is_refused_unless_every_member_is_in_the_run(tmp_path, hosts, needles):
    members = group.members(PLAN, [{"host": h, "address": f"10.9.0.{i + 1}"} for i, h in enumerate(hosts)],
                            http_port=8000)
    rc, out = _run(tmp_path, members)
    assert rc == 2, out[-3000:]
    flat = " ".join(out.split())
    for n in needles:
        assert n in flat, flat[-3000:]
    assert "Traceback" not in out
    assert "Compute and validate the server command line" not in out  # refused first, before anything else


def test_the_network_preflight_runs_on_every_member_at_once_and_refuses_an_unreachable_head(tmp_path):
    """The role's network check (vllm_group_check, started asynchronously on every member, then awaited): two members
    on this machine, the head's address on no interface, so the other member cannot reach it - every member fails
    with the head's address and port before the command line is even computed."""
    from modelfleet.harness.servers import VLLM_VENV, reserved_ports

    py = VLLM_VENV / "bin" / "python"
    if not py.exists():
        pytest.skip("the vLLM CPU venv is missing (scripts/setup.sh --vllm)")
    with lo_addresses("192.0.2.76"):
        hosts = [{"host": "m0", "address": "192.0.2.99"}, {"host": "m1", "address": "192.0.2.76"}]
        members = group.members(PLAN, hosts, http_port=8000, group_port=reserved_ports(2))
        rc, out = _run(tmp_path, members, hosts=("m0", "m1"), vllm_service_python=str(py),
                       vllm_service_group_check_timeout=5, ansible_async_dir=str(tmp_path / "async"))
    flat = " ".join(out.split())
    assert rc == 2, out[-3000:]
    port = members[0]["ports"][0] + 1
    for rank, host in enumerate(("m0", "m1")):
        assert (f"{host} (rank {rank} of 2): the members did not all meet at the head's 192.0.2.99:{port} within 5 s"
                in flat), flat[-3000:]
    assert "nothing was stopped" in flat
    assert "Compute and validate the server command line" not in out
    # each member's check ran as an async job; a failed one leaves no results file behind either
    assert "Remove the network check's job file" in out
    assert (tmp_path / "async").is_dir() and list((tmp_path / "async").iterdir()) == []
