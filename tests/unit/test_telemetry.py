"""Benchmark telemetry: the server's CPU from its process tree, GPU samples from nvidia-smi's recorded output on a
real H200, and their summary per point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import telemetry as t
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import GpuFactsError

from tests.conftest import FIXTURES

H200 = FIXTURES / "nvidia-smi" / "h200-1gpu"


def test_the_server_cpu_counts_every_process_below_it():
    """A parent that sleeps and a child that burns a core: the tree's CPU is the child's, not the parent's zero."""
    burn = "import time\\nt = time.time()\\nwhile time.time() - t < 3: pass"
    code = f"import subprocess, sys, time\nc = subprocess.Popen([sys.executable, '-c', '{burn}'])\ntime.sleep(4)\n"
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)
        a, ta = t.proc_tree_cpu_seconds(p.pid), time.perf_counter()
        time.sleep(1.0)
        b, tb = t.proc_tree_cpu_seconds(p.pid), time.perf_counter()
        own = int(open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[11]) / os.sysconf("SC_CLK_TCK")
    finally:
        p.wait(10)
    # the child's burning is counted (a share of a core however busy the machine): the tree has more CPU than the
    # parent's own, and it grew while the parent slept
    assert b - own > 0.05 and b - a > 0.05, (a, b, tb - ta, own)
    assert t.proc_tree_cpu_seconds(p.pid) is None  # gone


def test_summarise_gives_cores_and_per_gpu_figures():
    gpu = {"index": 0, "util_pct": 50.0, "mem_used_bytes": 10, "power_w": 300.0, "pcie_tx_bytes_s": None,
           "pcie_rx_bytes_s": 2048.0}
    samples = [{"t": 0.0, "server_cpu_s": 10.0, "gpus": [gpu]},
               {"t": 0.5, "server_cpu_s": 10.5, "gpus": [dict(gpu, util_pct=100.0, power_w=500.0, mem_used_bytes=30)]},
               {"t": 1.0, "server_cpu_s": 11.5, "gpus": [dict(gpu, util_pct=90.0)]}]
    s = t.summarise(samples)
    assert (s["samples"], s["server_cpu_cores_mean"], s["server_cpu_cores_max"]) == (3, 1.5, 2.0)
    [g] = s["gpus"]
    assert g["util_pct_mean"] == pytest.approx(80.0) and g["util_pct_max"] == 100.0 and g["mem_used_bytes_max"] == 30
    assert g["power_w_mean"] == pytest.approx(366.67, 0.01) and g["pcie_tx_bytes_s_mean"] is None
    assert t.summarise([{"t": 0.0}])["server_cpu_cores_mean"] is None and t.summarise([])["gpus"] == []


def test_a_host_without_gpus_samples_none():
    s = t.GpuSampler()
    if s.kind is None:  # this machine: no NVML, no nvidia-smi
        assert s.sample() is None


def test_a_malformed_smi_answer_is_named():
    with pytest.raises(GpuFactsError, match="columns, expected 4"):
        t.parse_smi_sample("0, 55\n")
    assert t.parse_smi_sample("0, [N/A], 100, [Not Supported]\n")[0] == {
        "index": 0, "util_pct": None, "mem_used_bytes": 100 * 2**20, "power_w": None, "pcie_tx_bytes_s": None,
        "pcie_rx_bytes_s": None}


def test_recorded_h200_samples_idle_and_under_a_matrix_product_loop():
    """Real outputs (scripts/device/h200_telemetry.sh on the lent H200, 2026-12-05): nvidia-smi's query idle, then
    once every ~0.5 s while bf16 8192^3 products and 1 GiB host-to-device copies ran; summarised as a point's."""
    folder = FIXTURES / "nvidia-smi" / "h200-1gpu-telemetry"
    (idle,) = t.parse_smi_sample((folder / "query-telemetry-idle.csv").read_text())
    assert idle == {"index": 0, "util_pct": 0.0, "mem_used_bytes": 0, "power_w": 78.79, "pcie_tx_bytes_s": None,
                    "pcie_rx_bytes_s": None}
    lines = (folder / "query-telemetry-busy.csv").read_text().splitlines()
    samples = [{"t": 0.5 * i, "gpus": t.parse_smi_sample(line)} for i, line in enumerate(lines)]
    (gpu,) = t.summarise(samples)["gpus"]
    assert len(samples) == 12 and gpu["util_pct_max"] == 100.0 and gpu["util_pct_mean"] == 99.5
    assert gpu["mem_used_bytes_max"] == 2037 * 2**20 and 590 < gpu["power_w_mean"] < 610 < gpu["power_w_max"] + 3
    assert gpu["pcie_rx_bytes_s_mean"] is None  # nvidia-smi's query has no PCIe throughput; NVML's reading does
    # the same load read by NVML in the same run (the log): PCIe both ways, and memory 615 MiB above nvidia-smi's
    log = (folder / "telemetry-run.log").read_text()
    nvml = json.loads(log.split("nvml summary: ", 1)[1].splitlines()[0])["gpus"][0]
    assert nvml["pcie_rx_bytes_s_mean"] > 10e9 and nvml["util_pct_mean"] > 99
    assert nvml["mem_used_bytes_max"] - gpu["mem_used_bytes_max"] == 644_743_168
