"""GPU facts from NVML (nvidia-ml-py) or, failing that, from nvidia-smi's machine-readable outputs
(`-q -x` XML, `--query-gpu` CSV, `topo -m` matrix) - never from the human table view.

Pure parsers (`parse_smi_xml`, `parse_query_csv`, `parse_topo_matrix`, `summarise_interconnect`,
`unit_of_pid_cgroup`) are unit-tested on real recorded outputs; `collect` does the I/O."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import GpuFactsError

MiB = 2**20
QUERY_FIELDS = ("index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "memory.free",
                "driver_version", "compute_cap", "power.limit", "temperature.gpu", "utilization.gpu")
LINK_KINDS = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")
# NVML common-ancestor levels -> the nvidia-smi topo names
NVML_TOPO = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _mib(text: str | None) -> int | None:
    if not text:
        return None
    m = re.match(r"^\s*([\d.]+)\s*MiB", text)
    return int(float(m.group(1)) * MiB) if m else None


def _watts(text: str | None) -> float | None:
    m = re.match(r"^\s*([\d.]+)\s*W", text or "")
    return float(m.group(1)) if m else None


def parse_smi_xml(xml_text: str) -> dict:
    """`nvidia-smi -q -x` -> system facts, per-GPU facts and processes (memory in bytes, from MiB)."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as e:
        raise GpuFactsError(f"nvidia-smi -q -x: not valid XML ({e})") from None
    gpus, procs = [], []
    for i, g in enumerate(root.findall("gpu")):
        uuid = g.findtext("uuid")
        gpus.append({
            "index": int(g.findtext("minor_number") or i) if (g.findtext("minor_number") or "").isdigit() else i,
            "uuid": uuid,
            "name": g.findtext("product_name"),
            "architecture": g.findtext("product_architecture"),
            "pci_bus_id": g.findtext("pci/pci_bus_id") or g.get("id"),
            "memory_total_bytes": _mib(g.findtext("fb_memory_usage/total")),
            "memory_used_bytes": _mib(g.findtext("fb_memory_usage/used")),
            "memory_free_bytes": _mib(g.findtext("fb_memory_usage/free")),
            "memory_reserved_bytes": _mib(g.findtext("fb_memory_usage/reserved")),
            "power_limit_w": _watts(g.findtext("gpu_power_readings/current_power_limit")
                                    or g.findtext("power_readings/power_limit")),
            "compute_capability": None,
            "memory_precision": "MiB",
        })
        for p in g.findall("processes/process_info"):
            pid = p.findtext("pid")
            procs.append({"pid": int(pid) if pid and pid.isdigit() else None, "name": p.findtext("process_name"),
                          "bytes": _mib(p.findtext("used_memory")), "gpu_uuid": uuid, "gpu_index": gpus[-1]["index"],
                          "type": p.findtext("type")})
    cuda = root.findtext("cuda_version")
    return {"driver_version": root.findtext("driver_version"), "cuda_driver_version": cuda,
            "gpu_count": len(gpus), "gpus": gpus, "processes": procs}


def parse_query_csv(text: str, fields: tuple[str, ...] | list[str] = QUERY_FIELDS) -> list[dict]:
    """`nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`."""
    rows = []
    for rec in csv.reader(io.StringIO(text.strip())):
        if not rec:
            continue
        vals = [v.strip() for v in rec]
        if len(vals) != len(fields):
            raise GpuFactsError(f"nvidia-smi --query-gpu: {len(vals)} columns, expected {len(fields)} ({fields})")
        rows.append(dict(zip(fields, vals, strict=True)))
    return rows


def parse_topo_matrix(text: str) -> dict:
    """`nvidia-smi topo -m` -> {(i, j): 'NV4' | 'PIX' | ...} for GPU pairs (i != j)."""
    lines = [ln.rstrip("\n") for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split("\t")
    cols = [c.strip() for c in header]
    gpu_cols = [(k, int(c[3:])) for k, c in enumerate(cols) if re.fullmatch(r"GPU\d+", c)]
    out = {}
    for ln in lines[1:]:
        cells = ln.split("\t")
        m = re.fullmatch(r"GPU(\d+)", cells[0].strip())
        if not m:
            continue
        i = int(m.group(1))
        for k, j in gpu_cols:
            if k < len(cells) and i != j:
                v = cells[k].strip()
                if v != "X":
                    out[(i, j)] = v
    return out


def summarise_interconnect(n: int, matrix: dict) -> str:
    """single | nvlink (every pair over NVLink) | pcie (no pair over NVLink) | mixed."""
    if n <= 1:
        return "single"
    kinds = [matrix.get((i, j)) for i in range(n) for j in range(n) if i != j]
    nv = [k for k in kinds if k and k.startswith("NV")]
    if len(nv) == len(kinds):
        return "nvlink"
    if not nv:
        return "pcie"
    return "mixed"


def unit_of_pid_cgroup(cgroup_text: str) -> str | None:
    """The systemd unit owning a process, from /proc/<pid>/cgroup (v2 '0::/system.slice/x.service' or v1)."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        for part in reversed(path.split("/")):
            if part.endswith((".service", ".scope")):
                return part
    return None


def _proc_unit(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return unit_of_pid_cgroup(f.read())
    except OSError:
        return None


def _proc_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


# --------------------------------------------------------------------------- collection (I/O)
def collect_nvml() -> dict:
    import pynvml as N

    N.nvmlInit()
    try:
        drv = N.nvmlSystemGetDriverVersion()
        cuda = N.nvmlSystemGetCudaDriverVersion_v2()
        n = N.nvmlDeviceGetCount()
        handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        gpus, procs = [], []
        for i, h in enumerate(handles):
            mem = N.nvmlDeviceGetMemoryInfo(h)
            try:
                plimit = N.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
            except N.NVMLError:
                plimit = None
            major, minor = N.nvmlDeviceGetCudaComputeCapability(h)
            uuid = N.nvmlDeviceGetUUID(h)
            gpus.append({"index": i, "uuid": uuid, "name": N.nvmlDeviceGetName(h),
                         "pci_bus_id": N.nvmlDeviceGetPciInfo(h).busId,
                         "memory_total_bytes": int(mem.total), "memory_used_bytes": int(mem.used),
                         "memory_free_bytes": int(mem.free), "power_limit_w": plimit,
                         "compute_capability": f"{major}.{minor}", "memory_precision": "bytes"})
            for p in N.nvmlDeviceGetComputeRunningProcesses(h):
                procs.append({"pid": p.pid, "name": _proc_name(p.pid), "bytes": p.usedGpuMemory, "gpu_uuid": uuid,
                              "gpu_index": i, "type": "C"})
        matrix = {}
        bus = {gpus[i]["pci_bus_id"].lower(): i for i in range(n)}
        for i in range(n):
            links = {}
            for link in range(18):
                try:
                    if N.nvmlDeviceGetNvLinkState(handles[i], link) != N.NVML_FEATURE_ENABLED:
                        continue
                    remote = N.nvmlDeviceGetNvLinkRemotePciInfo_v2(handles[i], link).busId.lower()
                except N.NVMLError:
                    continue
                j = bus.get(remote)
                if j is not None:
                    links[j] = links.get(j, 0) + 1
            for j in range(n):
                if i == j:
                    continue
                if links.get(j):
                    matrix[(i, j)] = f"NV{links[j]}"
                else:
                    level = N.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                    matrix[(i, j)] = NVML_TOPO.get(level, str(level))
        return {"source": "nvml", "driver_version": drv, "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
                "gpu_count": n, "gpus": gpus, "processes": procs, "matrix": matrix}
    finally:
        N.nvmlShutdown()


def collect_smi(run=subprocess.run) -> dict:
    x = run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True, check=False)
    if x.returncode != 0:
        raise GpuFactsError((x.stdout + x.stderr).strip().splitlines()[-1] if (x.stdout + x.stderr).strip()
                            else f"nvidia-smi -q -x exited {x.returncode}")
    facts = parse_smi_xml(x.stdout)
    q = run(["nvidia-smi", f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=False)
    if q.returncode == 0:
        by_uuid = {r["uuid"]: r for r in parse_query_csv(q.stdout)}
        for g in facts["gpus"]:
            r = by_uuid.get(g["uuid"])
            if r:
                g["compute_capability"] = r["compute_cap"]
                g["index"] = int(r["index"])
    t = run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=False)
    facts["matrix"] = parse_topo_matrix(t.stdout) if t.returncode == 0 else {}
    for p in facts["processes"]:
        p["name"] = _proc_name(p["pid"]) or p["name"] if p["pid"] else p["name"]
    facts["source"] = "nvidia-smi"
    return facts


def finish(facts: dict) -> dict:
    n = facts["gpu_count"]
    matrix = facts.pop("matrix", {})
    facts["interconnect_matrix"] = [[("X" if i == j else matrix.get((i, j))) for j in range(n)] for i in range(n)]
    facts["interconnect"] = summarise_interconnect(n, matrix)
    for p in facts["processes"]:
        p["unit"] = _proc_unit(p["pid"]) if p.get("pid") else None
    ccs = sorted({g["compute_capability"] for g in facts["gpus"] if g.get("compute_capability")})
    facts["compute_capabilities"] = ccs
    mems = [g["memory_total_bytes"] for g in facts["gpus"] if g.get("memory_total_bytes")]
    facts["min_memory_total_bytes"] = min(mems) if mems else 0
    facts["reason"] = None
    return facts


def no_gpus(reason: str) -> dict:
    return {"source": None, "gpu_count": 0, "gpus": [], "processes": [], "interconnect": "none",
            "interconnect_matrix": [], "driver_version": None, "cuda_driver_version": None,
            "compute_capabilities": [], "min_memory_total_bytes": 0, "reason": reason}


def collect(prefer_nvml: bool = True, run=subprocess.run) -> dict:
    """NVML when importable and initialisable, else nvidia-smi, else gpu_count 0 with the reason."""
    nvml_error = None
    if prefer_nvml:
        try:
            import pynvml  # noqa: F401

            return finish(collect_nvml())
        except ImportError:
            nvml_error = "nvidia-ml-py not installed"
        except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, _NoPermission ...
            nvml_error = f"NVML: {e}"
    if not shutil.which("nvidia-smi"):
        lib = any(os.path.exists(p) for p in ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                                              "/usr/lib64/libnvidia-ml.so.1", "/usr/lib/libnvidia-ml.so.1"))
        why = "no NVIDIA driver: nvidia-smi not found" + ("" if lib else " and no libnvidia-ml")
        return no_gpus(why + (f" ({nvml_error})" if nvml_error else ""))
    try:
        return finish(collect_smi(run))
    except GpuFactsError as e:
        msg = str(e)
        kind = "no device" if "No devices were found" in msg or "no devices" in msg.lower() else "driver error"
        return no_gpus(f"{kind}: {msg}")
