"""Multi-host layouts (group.layout) and member derivation (group.members) on the real Kimi-K2.5 INT4 layout."""

from __future__ import annotations

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import PlanError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.group import layout, members
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import GiB

from tests.conftest import FIXTURES

CK = FIXTURES / "checkpoints"
SEED_HOST = {"count": 8, "memory_bytes": 96 * GiB, "interconnect": "pcie", "compute_capability": "12.0"}
H100_HOST = {"count": 8, "memory_bytes": 80 * GiB, "interconnect": "nvlink", "compute_capability": "9.0"}


def test_the_seed_host_stays_one_host_with_tp8(kimi):
    p = layout(kimi, [SEED_HOST, SEED_HOST])
    assert (p["layout"], p["nodes"], p["tensor_parallel_size"], p["pipeline_parallel_size"]) == ("single", 1, 8, 1)
    assert p["reasons"][0].startswith("one host: the model fits 8 x ")


def test_kimi_int4_on_8x80gb_needs_two_hosts_in_pipeline(kimi):
    p = layout(kimi, [H100_HOST] * 3)
    assert (p["layout"], p["nodes"], p["tensor_parallel_size"], p["pipeline_parallel_size"]) == ("pp", 2, 8, 2)
    assert p["fits"] and p["kv_tokens_capacity"] >= 2048
    assert p["reasons"][0].startswith("2 hosts: the model does not fit one host of 8 x 85.90 GB (80.00 GiB)")
    single = layout(kimi, [SEED_HOST])  # the same model per GPU: about half the weights at PP=2
    assert p["weight_bytes_per_gpu"] < 0.55 * single["weight_bytes_per_gpu"]
    assert "PP" in p["formulas"]["weight_bytes_per_gpu"]


def test_a_model_that_fits_no_group_is_refused_with_what_was_tried(kimi):
    with pytest.raises(PlanError, match=r"does not fit one host of 8 x .*80.00 GiB.*short by .*add hosts to the group"):
        layout(kimi, [H100_HOST])
    small = {"count": 2, "memory_bytes": 24 * GiB, "interconnect": "pcie"}
    with pytest.raises(PlanError, match=r"PP=2: .* PP=3: "):
        layout(kimi, [small] * 3)


def test_hosts_of_different_gpus_are_not_one_group(kimi):
    with pytest.raises(PlanError, match="must have the same GPUs"):
        layout(kimi, [dict(SEED_HOST, host="a"), dict(H100_HOST, host="b")])


def test_the_profile_asks_for_a_layout(kimi):
    dp = layout(kimi, [SEED_HOST] * 2, {"vllm": {"multi_host": {"layout": "dp"}}})
    assert (dp["layout"], dp["nodes"], dp["data_parallel_size"], dp["tensor_parallel_size"]) == ("dp", 2, 2, 8)
    with pytest.raises(PlanError, match="data parallel keeps a whole copy"):
        layout(kimi, [H100_HOST] * 2, {"vllm": {"multi_host": {"layout": "dp"}}})
    with pytest.raises(PlanError, match="does not fit one host"):
        layout(kimi, [H100_HOST] * 2, {"vllm": {"multi_host": {"layout": "single"}}})
    three = layout(kimi, [H100_HOST] * 3, {"vllm": {"multi_host": {"layout": "pp", "nodes": 3}}})
    assert (three["nodes"], three["pipeline_parallel_size"]) == (3, 3)
    for bad, needle in (({"layout": "ray"}, "must be one of"), ({"nodes": 0}, "whole number"),
                        ({"nodes": 4}, "asks for 4 hosts; the group has 3")):
        with pytest.raises(PlanError, match=needle):
            layout(kimi, [H100_HOST] * 3, {"vllm": {"multi_host": bad}})


HOSTS = [{"host": "gpu-a", "address": "10.0.0.1", "ifname": "ens5"}, {"host": "gpu-b", "address": "10.0.0.2"}]


def test_members_of_a_pipeline_group(kimi):
    p = layout(kimi, [H100_HOST] * 2)
    head, other = members(p, HOSTS, http_port=8000)
    assert (head["role"], head["rank"], other["role"], other["rank"]) == ("head", 0, "headless", 1)
    assert head["args"] == ["--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "0",
                            "--master-addr", "10.0.0.1", "--master-port", "29501"]
    assert other["args"][-1] == "--headless" and other["args"][5:8] == ["1", "--master-addr", "10.0.0.1"]
    assert head["environment"] == {"VLLM_HOST_IP": "10.0.0.1", "GLOO_SOCKET_IFNAME": "ens5",
                                   "NCCL_SOCKET_IFNAME": "ens5"}
    assert other["environment"] == {"VLLM_HOST_IP": "10.0.0.2"}
    assert head["peers"] == ["10.0.0.2"] and other["peers"] == ["10.0.0.1"] and head["ports"] == [29501]


def test_members_of_a_data_parallel_group(kimi):
    p = layout(kimi, [SEED_HOST] * 2, {"vllm": {"multi_host": {"layout": "dp"}}})
    head, other = members(p, HOSTS, http_port=8000, group_port=13345)
    assert head["args"] == ["--data-parallel-size", "2", "--data-parallel-size-local", "1",
                            "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345"]
    assert other["args"][-3:] == ["--data-parallel-start-rank", "1", "--headless"]


@pytest.mark.parametrize("hosts,port,needle", [
    ([HOSTS[0]], None, "needs 2 hosts and the group has 1: add 1"),
    ([HOSTS[0], {"host": "gpu-b"}], None, "gpu-b: no group address"),
    ([HOSTS[0], {"host": "gpu-b", "address": "gpu-b.local"}], None, "is not an IP address"),
    ([HOSTS[0], {"host": "gpu-b", "address": "127.0.0.1"}], None, "is loopback"),
    ([HOSTS[0], {"host": "gpu-b", "address": "10.0.0.1"}], None, "share a group address"),
    ([HOSTS[0], {"host": "gpu-a", "address": "10.0.0.2"}], None, "distinct host name"),
    (HOSTS, 8000, "other than the HTTP port 8000"),
    (HOSTS, 80, "must be a free port in 1024-65535"),
    # the interface goes into the unit's Environment=: a newline there would add directives, run as root
    ([HOSTS[0], {"host": "gpu-b", "address": "10.0.0.2", "ifname": "eth0\nExecStartPre=/bin/sh -c id"}], None,
     r"gpu-b: group interface 'eth0\\nExecStartPre=/bin/sh -c id' \(vllm_service_group_ifname\) is not an interface"),
    ([HOSTS[0], {"host": "gpu-b", "address": "10.0.0.2", "ifname": "a-name-longer-than-15"}], None,
     "is not an interface name"),
    ([HOSTS[0], {"host": "gpu-b", "address": "10.0.0.2", "ifname": "^docker"}], None, "is not an interface name"),
])
def test_what_cannot_be_derived_is_refused(kimi, hosts, port, needle):
    p = layout(kimi, [H100_HOST] * 2)
    with pytest.raises(PlanError, match=needle):
        members(p, hosts, http_port=8000, group_port=port)


def test_interface_names_and_lists_pass_through_to_both_socket_variables(kimi):
    p = layout(kimi, [H100_HOST] * 2)
    for name in ("ens8f0", "ib0.8001", "eth0:1", "ens8f0,ens8f1"):
        m = members(p, [HOSTS[0], {"host": "gpu-b", "address": "10.0.0.2", "ifname": name}], http_port=8000)
        assert m[1]["environment"] == {"VLLM_HOST_IP": "10.0.0.2", "GLOO_SOCKET_IFNAME": name,
                                       "NCCL_SOCKET_IFNAME": name}


def test_a_single_host_plan_has_no_members(kimi):
    with pytest.raises(PlanError, match="not 'single'"):
        members(layout(kimi, [SEED_HOST]), HOSTS, http_port=8000)


SERVING = {"name": "big", "layout": "pp", "nodes": 2, "port": 29600, "hosts": ["h1", "h2"], "head": "h1"}


def test_a_replicas_plan_is_the_planners_over_every_member_or_the_declared_layout_on_cpu_hosts(kimi):
    """A fleet file's multi-host replica: on GPU hosts the plan is group.layout over every member's GPUs with the
    declared layout and nodes (Kimi INT4 on two 8 x 80 GB hosts: PP=2, TP=8); on hosts without GPU facts the
    declared layout is the plan; a plan for another layout is refused."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.group import layout_request, replica_plan

    gpu = layout(kimi, [H100_HOST] * 2, layout_request({"vllm": {"max_model_len": 4096}}, SERVING))
    assert replica_plan(SERVING, gpu) is gpu
    assert (gpu["layout"], gpu["nodes"], gpu["pipeline_parallel_size"], gpu["tensor_parallel_size"]) == ("pp", 2, 2, 8)
    # the same request on the seed's hosts is still pipeline parallel (asked for), not one host
    seed = layout(kimi, [SEED_HOST] * 2, layout_request(None, SERVING))
    assert (seed["layout"], seed["nodes"]) == ("pp", 2)
    cpu = replica_plan(dict(SERVING, layout="dp", nodes=3))
    assert (cpu["layout"], cpu["nodes"], cpu["pipeline_parallel_size"], cpu["data_parallel_size"]) == ("dp", 3, 1, 3)
    assert cpu["reasons"] == ["dp over 3 hosts, as the fleet file's multi_host asks (no GPU facts to plan from)"]
    with pytest.raises(PlanError, match=r"the plan is single on 1 host\(s\), the fleet file asks for pp on 2"):
        replica_plan(SERVING, layout(kimi, [SEED_HOST] * 2))
    with pytest.raises(PlanError, match=r"needs layout pp or dp and nodes >= 2, got 'tp' and 2"):
        replica_plan(dict(SERVING, layout="tp"))


def test_the_replica_members_filter_derives_each_member_from_the_fleet_files_replica():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.modelfleet.fleet.plugins.filter.group import replica_members

    hostvars = {"h1": {"vllm_service_group_address": "10.9.0.1"},
                "h2": {"vllm_service_group_address": "10.9.0.2", "vllm_service_group_ifname": "ens8"}}
    m = replica_members(SERVING, hostvars, 8000)
    assert [(x["host"], x["rank"], x["role"]) for x in m] == [("h1", 0, "head"), ("h2", 1, "headless")]
    assert m[1]["args"] == ["--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                            "10.9.0.1", "--master-port", "29600", "--headless"]
    assert m[1]["environment"] == {"VLLM_HOST_IP": "10.9.0.2", "GLOO_SOCKET_IFNAME": "ens8",
                                   "NCCL_SOCKET_IFNAME": "ens8"}
    with pytest.raises(AnsibleFilterError, match=r"replica_members: the plan is pp on 3 host\(s\)"):
        replica_members(SERVING, hostvars, 8000, {"layout": "pp", "nodes": 3})
    with pytest.raises(AnsibleFilterError, match=r"group_members: h2: no group address"):
        replica_members(SERVING, {"h1": hostvars["h1"], "h2": {}}, 8000)


@pytest.mark.parametrize("request_,serving,problem", [
    (None, None, ""),
    ({"layout": "auto"}, None, ""),
    ({"layout": "single"}, None, ""),
    (None, SERVING, ""),
    ({"layout": "pp", "nodes": 2}, SERVING, ""),
    ({"layout": "auto", "nodes": "auto"}, SERVING, ""),
    ({"layout": "pp", "nodes": 2}, None,
     "profile p asks for pp over 2 hosts (vllm.multi_host), and this host serves alone: declare the replica on its "
     "fleet group"),
    ({"nodes": 3}, None, "profile p asks for a layout over 3 hosts"),
    ({"layout": "dp"}, SERVING, "profile p asks for dp on auto host(s) (vllm.multi_host), and its fleet group makes "
                                "replica big pp on 2 hosts (multi_host): make them agree"),
    ({"layout": "pp", "nodes": 3}, SERVING, "profile p asks for pp on 3 host(s)"),
    ({"layout": "single"}, SERVING, "profile p asks for single on auto host(s)"),
])
def test_a_profiles_multi_host_request_and_the_fleet_files_replica_must_agree(request_, serving, problem):
    """Neither is silently dropped: a profile that asks for several hosts on a host that serves alone, or for another
    layout than its replica's, is refused before anything runs (deploy_model.yml's preflight)."""
    from ansible_collections.modelfleet.fleet.plugins.filter.group import replica_request_problem

    profile = {"name": "p", "vllm": {"multi_host": request_} if request_ else {}}
    got = replica_request_problem(profile, serving)
    assert (got.startswith(problem) if problem else got == ""), got


def test_a_headless_members_own_unit_says_when_it_died_before_ready():
    """The readiness poll runs at the head; a headless member's crash loop shows only in its own unit, which each
    member reads (systemd_service's status) and judges with readiness.start_verdict."""
    from ansible_collections.modelfleet.fleet.plugins.filter.group import unit_start_verdict

    running = {"ActiveState": "active", "SubState": "running", "NRestarts": "0"}
    looping = {"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "1", "ExecMainCode": "1",
               "ExecMainStatus": "1"}
    assert unit_start_verdict(running, 0) == ""
    assert unit_start_verdict(looping, 0) == ("the server exited before it was ready (exit status 1) and systemd "
                                              "restarted it 2 time(s); allowed before ready: 0")
    assert unit_start_verdict(looping, 2) == ""
    assert unit_start_verdict(dict(looping, NRestarts=5), -1) == ""  # not started by this run: older history
    assert unit_start_verdict({"ActiveState": "failed", "Result": "exit-code", "ExecMainCode": "1",
                               "ExecMainStatus": "1"}, -1).startswith("the unit failed (exit-code, exit status 1)")
