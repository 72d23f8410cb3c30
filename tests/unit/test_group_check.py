"""The group's network preflight, its pure part (group_check): the check's port and spec per member, the figures
from a run's output, and what a failure says. The run itself, two real members, is in
tests/integration/test_group_check.py."""

from __future__ import annotations

import json

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import PlanError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.group import members
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.group_check import (
    check_port,
    describe,
    failure,
    parse,
    spec,
    summarise,
)

from tests.conftest import FIXTURES

PLAN = {"layout": "pp", "nodes": 3, "pipeline_parallel_size": 3}
HOSTS = [{"host": "a", "address": "10.0.0.1", "ifname": "eth1"}, {"host": "b", "address": "10.0.0.2"},
         {"host": "c", "address": "10.0.0.3"}]
MEMBERS = members(PLAN, HOSTS, http_port=8000, group_port=29501)


def test_each_member_meets_at_the_head_on_the_port_after_the_groups():
    specs = [spec(MEMBERS, h, gpu_count=8) for h in ("a", "b", "c")]
    assert [s["rank"] for s in specs] == [0, 1, 2]
    assert {(s["master_addr"], s["port"], s["world"]) for s in specs} == {("10.0.0.1", 29502, 3)}
    # each member's own environment: the interface the unit's vLLM uses is the one the check uses
    assert specs[0]["environment"] == {"VLLM_HOST_IP": "10.0.0.1", "GLOO_SOCKET_IFNAME": "eth1",
                                       "NCCL_SOCKET_IFNAME": "eth1"}
    assert specs[1]["environment"] == {"VLLM_HOST_IP": "10.0.0.2"}
    assert spec(MEMBERS, "b", port=40000)["port"] == 40000
    assert spec(MEMBERS, "a", size_bytes=1001)["bytes"] == 1000  # whole float32 elements


@pytest.mark.parametrize(("kw", "match"), [
    ({"host": "z"}, r"z is not a member of the group \(a, b, c\)"),
    ({"host": "a", "backend": "mpi"}, r"backend must be one of auto, gloo, nccl"),
    ({"host": "a", "size_bytes": 0}, r"size_bytes must be a whole number >= 4"),
    ({"host": "a", "iterations": True}, r"iterations must be a whole number >= 1"),
    ({"host": "a", "timeout": 1}, r"timeout must be a whole number >= 5"),
    ({"host": "a", "port": 29501}, r"port 29501 is the group's own port"),
    ({"host": "a", "port": 80}, r"port 80 must be in 1024-65535"),
])
def test_what_cannot_be_checked_is_refused(kw, match):
    with pytest.raises(PlanError, match=match):
        spec(MEMBERS, **kw)


def test_a_group_port_at_the_top_of_the_range_needs_its_check_port_named():
    top = members(PLAN, HOSTS, http_port=8000, group_port=65535)
    with pytest.raises(PlanError, match=r"port 65536 must be in 1024-65535"):
        check_port(top)
    assert check_port(top, 40000) == 40000


def _out(**kw):
    return {"backend": "gloo", "device": "cpu", "rank": 0, "world": 2, "bytes": 64 * 2**20,
            "seconds": [0.2, 0.1, 0.4, 0.1, 0.1], "join_seconds": 1.25, "sums_ok": True, "torch": "2.9.0", **kw}


def test_the_figures_are_the_median_and_nccl_tests_bus_bandwidth():
    fig = summarise(_out())
    assert fig["median_seconds"] == 0.1 and fig["iterations"] == 5
    assert fig["algbw_bytes_per_s"] == round(64 * 2**20 / 0.1)
    assert fig["busbw_bytes_per_s"] == fig["algbw_bytes_per_s"]  # 2(n-1)/n = 1 for two members
    four = summarise(_out(world=4))
    assert four["busbw_bytes_per_s"] == round(64 * 2**20 / 0.1 * 1.5)
    assert summarise(_out(world=1))["busbw_bytes_per_s"] == 0  # nothing crosses a link
    assert describe(fig) == ("gloo all-reduce of 67.11 MB (64.00 MiB) over 2 members: 100 ms (median of 5), "
                             "bus bandwidth 671.09 MB (640.00 MiB)/s; joined in 1.2 s")
    alone = describe(summarise(_out(world=1)))
    assert "over 1 member: " in alone and "one member: no link crossed" in alone
    assert "nccl" not in fig and summarise(_out(backend="nccl", nccl="2.27.3"))["nccl"] == "2.27.3"


def test_the_nccl_branch_as_recorded_on_a_real_h100():
    raw = json.loads((FIXTURES / "group_check" / "h100-nccl-1rank.json").read_text())
    fig = summarise(raw)
    assert (fig["backend"], fig["device"], fig["nccl"], fig["world"], fig["iterations"]) == \
        ("nccl", "NVIDIA H100 80GB HBM3", "2.28.9", 1, 10)
    assert fig["bytes"] == 256 * 2**20 and fig["busbw_bytes_per_s"] == 0 and fig["median_seconds"] > 0
    assert parse("NCCL INFO ...\n" + json.dumps(raw)) == raw


def test_wrong_sums_or_no_times_are_refused():
    with pytest.raises(PlanError, match=r"wrong sums: .* do not serve across this group"):
        summarise(_out(sums_ok=False))
    with pytest.raises(PlanError, match=r"measured no all-reduce time"):
        summarise(_out(seconds=[]))


def test_the_run_is_read_from_its_last_json_line():
    assert parse('warning: x\n{"not": "it"}\n{"seconds": [1], "world": 2}\n') == {"seconds": [1], "world": 2}
    assert parse("Traceback ...\n{broken\n") is None
    assert parse("") is None


@pytest.mark.parametrize(("rc", "output", "match"), [
    (None, "", r"b \(rank 1 of 3\): the group check did not end within 180 s; check that every member reaches"),
    (None, "", r"no other program listens on the head's check port 10\.0\.0\.1:29502 \(a member that reached"),
    (1, "ModuleNotFoundError: No module named 'torch'", r"the serving venv has no torch"),
    (1, "RuntimeError: The server socket has failed to listen on any local network address. "
        "port: 29502, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
     r"port 29502 is in use on the head \(10.0.0.1\); choose a free vllm_service_group_check_port"),
    (1, "torch.distributed.DistStoreError: Timed out after 61 seconds waiting for clients. 2/3 clients joined.",
     r"the members did not all meet at the head's 10.0.0.1:29502 within 60 s; check that every member reaches"),
    (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of "
        "79.19 GiB of which 20.75 MiB is free.", r"b: the group check's buffers \(67.11 MB \(64.00 MiB\) and NCCL's "
                                                 r"own\) found no room on GPU 0 .* vllm_service_group_check: false"),
    (1, "RuntimeError: something else\nline two\nlast line", r"failed \(exit 1\): RuntimeError: something else \| "
                                                              r"line two \| last line"),
])
def test_a_failure_names_the_address_port_and_what_to_check(rc, output, match):
    s = spec(MEMBERS, "b")
    with pytest.raises(AssertionError, match=match):
        raise AssertionError(failure(s, "b", rc, output))
