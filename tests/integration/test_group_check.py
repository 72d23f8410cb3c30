"""The group's network preflight as a module (vllm_group_check), run the way the role runs it: one `ansible` call per
member at the same time, each with the vLLM CPU venv's python (real torch.distributed, gloo), the members on two
addresses of the documentation range added to `lo`. What a user meets when a member cannot reach the head, or the
check's port is taken, is a message that names the address, the port and what to check."""

from __future__ import annotations

import json
import socket

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import group

from modelfleet.harness.servers import VLLM_VENV, reserved_ports
from tests.conftest import ansible_module, lo_addresses

pytestmark = pytest.mark.integration

ADDRESSES = ("192.0.2.73", "192.0.2.74")
PY = str(VLLM_VENV / "bin" / "python")


@pytest.fixture
def members():
    if not (VLLM_VENV / "bin" / "python").exists():
        pytest.skip("the vLLM CPU venv is missing (scripts/setup.sh --vllm)")
    with lo_addresses(*ADDRESSES) as addrs:
        yield group.members({"layout": "pp", "nodes": 2, "pipeline_parallel_size": 2},
                            [{"host": "m0", "address": addrs[0]}, {"host": "m1", "address": addrs[1]}],
                            http_port=8000, group_port=reserved_ports(2))  # the group's port, the check's + 1


def _start(members, host, **kw):
    return ansible_module("vllm_group_check", {"python": PY, "members": members, "host": host,
                                               "size_bytes": 4 * 2**20, "iterations": 3, **kw}, popen=True)


def _result(proc):
    out, _ = proc.communicate(timeout=300)
    res = json.loads(out[out.index("{"):])["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return proc.returncode, res


def test_two_members_meet_at_the_head_and_measure_an_all_reduce(members):
    procs = [_start(members, m["host"], timeout=60) for m in members]
    results = [_result(p) for p in procs]
    for rc, res in results:
        assert rc == 0, res.get("msg")
        net = res["network"]
        assert (net["backend"], net["device"], net["world"], net["bytes"], net["iterations"]) == \
            ("gloo", "cpu", 2, 4 * 2**20, 3)
        assert net["busbw_bytes_per_s"] > 0 and net["median_seconds"] > 0
        assert res["msg"].startswith("gloo all-reduce of 4.19 MB (4.00 MiB) over 2 members: ")
        assert res["changed"] is False


def test_a_member_that_cannot_reach_the_head_fails_with_the_address_and_port(members):
    # the head never comes: the other member waits at the head's check port until its timeout
    port = members[0]["ports"][0] + 1
    rc, res = _result(_start(members, "m1", timeout=5))
    assert rc != 0
    assert f"the members did not all meet at the head's {ADDRESSES[0]}:{port} within 5 s" in res["msg"], res["msg"]
    assert "nothing was stopped" in res["msg"]
    assert "Traceback" not in res["msg"]


def test_a_taken_check_port_at_the_head_is_named(members):
    port = members[0]["ports"][0] + 1
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen()
        rc, res = _result(_start(members, "m0", timeout=5))
    assert rc != 0
    assert f"the group check's port {port} is in use on the head ({ADDRESSES[0]})" in res["msg"], res["msg"]
