"""Telemetry during a benchmark point (issue 26): the server's CPU (its process and every descendant, from /proc) and,
on GPU hosts, each GPU's utilisation, memory, power and PCIe throughput - from NVML (nvidia-ml-py, as gpu.py reads
it) or, without it, from `nvidia-smi --query-gpu` (no PCIe throughput there). Sampled by the benchmark client every
metrics interval; `summarise` turns the samples into the point's figures (pure, unit-tested on recorded outputs)."""

from __future__ import annotations

import os
import shutil
import subprocess

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.gpu import parse_query_csv

SMI_FIELDS = ("index", "utilization.gpu", "memory.used", "power.draw")


def _num(text: str | None) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None  # "[N/A]", "[Not Supported]"


def parse_smi_sample(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=index,utilization.gpu,memory.used,power.draw --format=csv,noheader,nounits`."""
    out = []
    for row in parse_query_csv(text, SMI_FIELDS):
        mem = _num(row["memory.used"])
        out.append({"index": int(row["index"]), "util_pct": _num(row["utilization.gpu"]),
                    "mem_used_bytes": int(mem * 2**20) if mem is not None else None,
                    "power_w": _num(row["power.draw"]), "pcie_tx_bytes_s": None, "pcie_rx_bytes_s": None})
    return out


class GpuSampler:
    """One look at every GPU per call; `kind` says how (nvml, nvidia-smi) or that there is none."""

    def __init__(self):
        self.kind, self._n, self._handles = None, None, []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._n = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.kind = "nvml" if self._handles else None
        except Exception:  # no library, no driver, no GPU: try the command line  # noqa: BLE001
            self._n = None
        if self.kind is None and shutil.which("nvidia-smi"):
            self.kind = "nvidia-smi" if self._smi() else None

    def _smi(self) -> list[dict]:
        try:
            r = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=5, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return []
        return parse_smi_sample(r.stdout) if r.returncode == 0 and r.stdout.strip() else []

    def sample(self) -> list[dict] | None:
        if self.kind == "nvml":
            N, out = self._n, []

            def read(fn, h, *a):
                try:
                    return fn(h, *a)
                except N.NVMLError:
                    return None

            for i, h in enumerate(self._handles):
                util, mem, power = (read(N.nvmlDeviceGetUtilizationRates, h), read(N.nvmlDeviceGetMemoryInfo, h),
                                    read(N.nvmlDeviceGetPowerUsage, h))
                tx = read(N.nvmlDeviceGetPcieThroughput, h, N.NVML_PCIE_UTIL_TX_BYTES)
                rx = read(N.nvmlDeviceGetPcieThroughput, h, N.NVML_PCIE_UTIL_RX_BYTES)
                out.append({"index": i, "util_pct": float(util.gpu) if util is not None else None,
                            "mem_used_bytes": int(mem.used) if mem is not None else None,
                            "power_w": power / 1000.0 if power is not None else None,
                            # NVML reports KB/s over its last 20 ms window
                            "pcie_tx_bytes_s": tx * 1024 if tx is not None else None,
                            "pcie_rx_bytes_s": rx * 1024 if rx is not None else None})
            return out
        if self.kind == "nvidia-smi":
            return self._smi() or None
        return None


def proc_tree_cpu_seconds(pid: int, proc: str = "/proc") -> float | None:
    """CPU seconds (user + system) so far of `pid` and every process below it; None when it is gone."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(name)] = int(fields[1])
        cpu[int(name)] = (int(fields[11]) + int(fields[12])) / tick
    if pid not in cpu:
        return None
    tree, frontier = {pid}, [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p and c not in tree]
        tree.update(kids)
        frontier.extend(kids)
    return sum(cpu[p] for p in tree)


def summarise(samples: list[dict]) -> dict:
    """The point's telemetry from samples [{t, server_cpu_s?, gpus?}] in time order: the server's CPU in cores
    (mean and max over the intervals) and, per GPU, utilisation (mean, max), memory used (max), power (mean, max)
    and PCIe throughput (mean each way)."""
    out: dict = {"samples": len(samples), "server_cpu_cores_mean": None, "server_cpu_cores_max": None, "gpus": []}
    cores = []
    for a, b in zip(samples, samples[1:], strict=False):
        if a.get("server_cpu_s") is not None and b.get("server_cpu_s") is not None and b["t"] > a["t"]:
            cores.append((b["server_cpu_s"] - a["server_cpu_s"]) / (b["t"] - a["t"]))
    if cores:
        out["server_cpu_cores_mean"], out["server_cpu_cores_max"] = sum(cores) / len(cores), max(cores)
    by_gpu: dict[int, list[dict]] = {}
    for s in samples:
        for g in s.get("gpus") or []:
            by_gpu.setdefault(g["index"], []).append(g)

    def stat(vals, fn):
        vals = [v for v in vals if v is not None]
        return fn(vals) if vals else None

    def mean(v):
        return sum(v) / len(v)

    for i, gs in sorted(by_gpu.items()):
        out["gpus"].append({
            "index": i, "util_pct_mean": stat([g["util_pct"] for g in gs], mean),
            "util_pct_max": stat([g["util_pct"] for g in gs], max),
            "mem_used_bytes_max": stat([g["mem_used_bytes"] for g in gs], max),
            "power_w_mean": stat([g["power_w"] for g in gs], mean),
            "power_w_max": stat([g["power_w"] for g in gs], max),
            "pcie_tx_bytes_s_mean": stat([g["pcie_tx_bytes_s"] for g in gs], mean),
            "pcie_rx_bytes_s_mean": stat([g["pcie_rx_bytes_s"] for g in gs], mean)})
    return out
