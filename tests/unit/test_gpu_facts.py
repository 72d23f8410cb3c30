"""gpu_facts parsers on real recorded outputs from an NVIDIA H200 (tests/fixtures/nvidia-smi/), the
module's own output from its run on that machine, and the no-GPU path on this machine."""

from __future__ import annotations

import json

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import GpuFactsError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.gpu import (
    collect,
    parse_query_csv,
    parse_smi_xml,
    parse_topo_matrix,
    summarise_interconnect,
    unit_of_pid_cgroup,
)

from tests.conftest import FIXTURES

SHARED = FIXTURES / "nvidia-smi" / "h200-1gpu"
RUN = FIXTURES / "nvidia-smi" / "h200-1gpu-modelfleet-run"


def test_xml_idle():
    f = parse_smi_xml((SHARED / "nvidia-smi-q.xml").read_text())
    assert f["driver_version"] == "580.159.04" and f["cuda_driver_version"] == "13.0" and f["gpu_count"] == 1
    g = f["gpus"][0]
    assert g["name"] == "NVIDIA H200" and g["architecture"] == "Hopper"
    assert g["uuid"] == "GPU-627c3a8a-6fb5-8ed8-719a-f4f78449b3e5" and g["pci_bus_id"] == "00000000:00:06.0"
    assert g["memory_total_bytes"] == 143771 * 2**20 and g["power_limit_w"] == 700.0
    assert f["processes"] == []


def test_xml_busy_reports_the_process_holding_memory():
    f = parse_smi_xml((SHARED / "nvidia-smi-q-busy.xml").read_text())
    [p] = f["processes"]
    assert (p["pid"], p["name"], p["bytes"]) == (428, "python3", 19592 * 2**20)
    assert p["gpu_uuid"] == f["gpus"][0]["uuid"]
    assert f["gpus"][0]["memory_used_bytes"] == 19601 * 2**20


def test_query_csv_gives_compute_capability():
    [r] = parse_query_csv((SHARED / "query-gpu.csv").read_text())
    assert r["compute_cap"] == "9.0" and r["memory.total"] == "143771" and r["name"] == "NVIDIA H200"
    [r2] = parse_query_csv((RUN / "query-gpu-nounits.csv").read_text())
    assert r2["compute_cap"] == "9.0"
    with pytest.raises(GpuFactsError, match="columns"):
        parse_query_csv("0, only, three")


def test_topology_of_one_gpu():
    for d in (SHARED, RUN):
        m = parse_topo_matrix((d / "topo-m.txt").read_text())
        assert m == {}
        assert summarise_interconnect(1, m) == "single"
    assert (SHARED / "nvlink-s.txt").read_text() == ""  # no NVLink on a single GPU


@pytest.mark.parametrize("n,matrix,kind", [
    (2, {(0, 1): "NV18", (1, 0): "NV18"}, "nvlink"),
    (2, {(0, 1): "PHB", (1, 0): "PHB"}, "pcie"),
    (3, {(0, 1): "NV4", (1, 0): "NV4", (0, 2): "SYS", (2, 0): "SYS", (1, 2): "SYS", (2, 1): "SYS"}, "mixed"),
])
def test_summary_rule(n, matrix, kind):
    assert summarise_interconnect(n, matrix) == kind


@pytest.mark.parametrize("text,unit", [
    ("0::/system.slice/modelfleet-vllm@kimi.service\n", "modelfleet-vllm@kimi.service"),
    ("0::/user.slice/user-0.slice/session-3.scope\n", "session-3.scope"),
    ("12:pids:/system.slice/ssh.service\n0::/system.slice/ssh.service\n", "ssh.service"),
    ("0::/\n", None),
])
def test_unit_from_cgroup(text, unit):
    assert unit_of_pid_cgroup(text) == unit


def _facts(name):
    text = (RUN / name).read_text()
    return json.loads(text[text.index("=>") + 2:])["gpu_facts"]


def test_module_output_on_the_real_h200():
    """What gpu_facts itself returned on the H200 (docs/gpu-and-environment.md: "GPU facts on a real H200")."""
    idle, busy, after = _facts("gpu_facts-nvml-idle.json"), _facts("gpu_facts-nvml-busy.json"), \
        _facts("gpu_facts-nvml-after.json")
    assert idle["source"] == "nvml" and idle["gpu_count"] == 1 and idle["interconnect"] == "single"
    assert idle["gpus"][0]["compute_capability"] == "9.0" and idle["gpus"][0]["memory_total_bytes"] == 150754820096
    holder = int((RUN / "holder.log").read_text().split()[-1])
    [p] = busy["processes"]
    assert p["pid"] == holder and p["name"] == "python3"
    assert p["bytes"] >= 20 * 2**30  # the 20 GiB tensor plus its CUDA context
    assert after["processes"] == []
    assert after["gpus"][0]["memory_used_bytes"] < busy["gpus"][0]["memory_used_bytes"] - 20 * 2**30
    smi = _facts("gpu_facts-smi-busy.json")
    assert smi["source"] == "nvidia-smi" and smi["processes"][0]["pid"] == holder
    assert smi["gpus"][0]["compute_capability"] == "9.0"  # from --query-gpu, not in the XML


def test_no_gpu_on_this_machine():
    f = collect()
    assert f["gpu_count"] == 0 and f["interconnect"] == "none"
    assert f["reason"].startswith("no NVIDIA driver")


def test_planner_takes_gpu_facts_as_they_are():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.planner import gpus_from_facts

    g = gpus_from_facts(_facts("gpu_facts-nvml-idle.json"))
    assert g == {"count": 1, "memory_bytes": 150754820096, "compute_capability": "9.0", "interconnect": "single"}
