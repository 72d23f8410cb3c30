"""The network preflight of a multi-host group (issue 24): before anything is stopped, every member runs one short
collective with the others - the rendezvous at the head, then all-reduces of a fixed size - through the same
torch.distributed backend and environment its vLLM unit gets (NCCL on GPU hosts, gloo on CPU hosts; VLLM_HOST_IP,
GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME). It proves the members reach each other on the private segment (the
store on a known port at the head, the collective's own connections on ephemeral ports, as vLLM's) and measures
the all-reduce's bandwidth, a figure that goes into the deploy's outcome and the benchmark's provenance.

The rendezvous uses the group port + 1 by default: during a redeploy the running group still holds the group
port, and nothing is stopped before the preflight passes.

Pure except `run`, which starts the venv's python with CHECK_CODE."""

from __future__ import annotations

import json
import os
import statistics
import subprocess

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import PlanError
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import fmt_bytes

# runs inside the vLLM venv (torch): argv[1] is spec()'s JSON; prints one JSON line
CHECK_CODE = r"""
import json, sys, time
from datetime import timedelta
a = json.loads(sys.argv[1])
import torch
import torch.distributed as dist
backend = a["backend"]
if backend == "auto":
    backend = "nccl" if a["gpu_count"] > 0 and torch.cuda.is_available() else "gloo"
dev = "cuda" if backend == "nccl" else "cpu"
if dev == "cuda":
    torch.cuda.set_device(0)
t0 = time.monotonic()
dist.init_process_group(backend, init_method="tcp://%s:%d" % (a["master_addr"], a["port"]), rank=a["rank"],
                        world_size=a["world"], timeout=timedelta(seconds=a["timeout"]))
joined = time.monotonic() - t0
x = torch.empty(a["bytes"] // 4, dtype=torch.float32, device=dev)
def sync():
    if dev == "cuda":
        torch.cuda.synchronize()
times, sums_ok = [], True
for i in range(a["iterations"] + 1):
    x.fill_(float(a["rank"] + 1))
    sync()
    dist.barrier()
    t = time.perf_counter()
    dist.all_reduce(x)
    sync()
    if i:
        times.append(time.perf_counter() - t)
    want = a["world"] * (a["world"] + 1) / 2
    sums_ok = sums_ok and float(x[0]) == want and float(x[-1]) == want
dist.destroy_process_group()
out = {"backend": backend, "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
       "rank": a["rank"], "world": a["world"], "bytes": x.numel() * 4, "seconds": times,
       "join_seconds": round(joined, 3), "sums_ok": sums_ok, "torch": torch.__version__}
if backend == "nccl":
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
print(json.dumps(out))
"""

BACKENDS = ("auto", "gloo", "nccl")
# what the check may take besides its rendezvous timeout: importing torch (and CUDA) on a loaded host, the
# collectives themselves (the role's async limit is the timeout + this + a margin)
START_SECONDS = 120


def check_port(members: list[dict], port: int = 0) -> int:
    """The rendezvous port of the check: `port` when given, else the group's port + 1 (the running group may hold its
    own port during a redeploy)."""
    group_port = ((members[0].get("ports") or [0])[0]) if members else 0
    p = port or (group_port + 1 if group_port else 0)
    if not isinstance(p, int) or isinstance(p, bool) or not 1024 <= p <= 65535:
        raise PlanError(f"the group check's port {p!r} must be in 1024-65535 (vllm_service_group_check_port, or a "
                        "group port below 65535)")
    if p == group_port:
        raise PlanError(f"the group check's port {p} is the group's own port, which a running group holds during a "
                        "redeploy; choose another vllm_service_group_check_port")
    return p


def spec(members: list[dict], host: str, port: int = 0, size_bytes: int = 64 * 2**20, iterations: int = 5,
         timeout: int = 60, gpu_count: int = 0, backend: str = "auto") -> dict:
    """What this member's check runs with: {rank, world, master_addr, port, bytes, iterations, timeout, gpu_count,
    backend, environment (the member's own: VLLM_HOST_IP, *_SOCKET_IFNAME)}. A host that is not a member, or values
    outside their ranges, are PlanErrors."""
    names = [m.get("host") for m in members]
    if host not in names:
        raise PlanError(f"{host} is not a member of the group ({', '.join(map(str, names))}); derive "
                        "vllm_service_group_members with the group_members filter over the group's hosts")
    if backend not in BACKENDS:
        raise PlanError(f"the group check's backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    for name, v, lo in (("size_bytes", size_bytes, 4), ("iterations", iterations, 1), ("timeout", timeout, 5)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise PlanError(f"the group check's {name} must be a whole number >= {lo}, got {v!r}")
    me = members[names.index(host)]
    return {"rank": me["rank"], "world": len(members), "master_addr": members[0]["address"],
            "port": check_port(members, port), "bytes": size_bytes - size_bytes % 4, "iterations": iterations,
            "timeout": timeout, "gpu_count": gpu_count, "backend": backend,
            "environment": dict(me.get("environment") or {})}


def summarise(out: dict) -> dict:
    """The figures of one member's run (CHECK_CODE's JSON): the median all-reduce time, its algorithm bandwidth
    (bytes / time) and bus bandwidth (algbw x 2(n-1)/n, nccl-tests' convention: what each link carried), bytes/s.
    Wrong sums are a PlanError."""
    if not out.get("sums_ok"):
        raise PlanError(f"the group's all-reduce over {out.get('backend')} returned wrong sums: a member's "
                        "collective library or network corrupts data; do not serve across this group")
    secs = [float(s) for s in out.get("seconds") or []]
    if not secs or min(secs) <= 0:
        raise PlanError(f"the group check measured no all-reduce time ({secs!r})")
    n, size = int(out["world"]), int(out["bytes"])
    med = statistics.median(secs)
    algbw = size / med
    busbw = algbw * 2 * (n - 1) / n if n > 1 else 0.0
    res = {k: out[k] for k in ("backend", "device", "world", "bytes", "join_seconds", "torch", "nccl") if k in out}
    res.update(iterations=len(secs), median_seconds=round(med, 6), algbw_bytes_per_s=round(algbw),
               busbw_bytes_per_s=round(busbw))
    return res


def describe(fig: dict) -> str:
    """One line for the deploy's output."""
    bw = (f"bus bandwidth {fmt_bytes(fig['busbw_bytes_per_s'])}/s" if fig["world"] > 1
          else "one member: no link crossed")
    return (f"{fig['backend']} all-reduce of {fmt_bytes(fig['bytes'])} over {fig['world']} member"
            f"{'s' if fig['world'] > 1 else ''}: {fig['median_seconds'] * 1000:.3g} ms (median of "
            f"{fig['iterations']}), {bw}; joined in {fig['join_seconds']:.1f} s")


def failure(s: dict, host: str, rc: int | None, output: str) -> str:
    """What a failed check means, for the error message: which address and port could not be reached, or what
    else went wrong, and what to check."""
    text = output or ""
    where = f"{s['master_addr']}:{s['port']}"
    fix = ("check that every member reaches the others' vllm_service_group_address (routes, firewalls between the "
           "hosts, the interface in vllm_service_group_ifname) and that every member of the group is in this run")
    if rc is None:
        # torch's store client waits without a limit for the answer of whatever accepted its connection
        return (f"{host} (rank {s['rank']} of {s['world']}): the group check did not end within "
                f"{s['timeout'] + START_SECONDS} s; {fix}, and that no other program listens on the head's check "
                f"port {where} (a member that reached one waits for an answer that never comes)")
    if "No module named 'torch'" in text:
        return f"{host}: the serving venv has no torch, so the group cannot be checked or served; install vLLM first"
    if "address already in use" in text.lower() or "EADDRINUSE" in text:
        return (f"{host}: the group check's port {s['port']} is in use on the head ({s['master_addr']}); choose a "
                "free vllm_service_group_check_port")
    if "out of memory" in text.lower():
        return (f"{host}: the group check's buffers ({fmt_bytes(s['bytes'])} and NCCL's own) found no room on GPU 0 "
                "(a running server holds it): lower vllm_service_group_check_bytes, or skip the check with "
                "vllm_service_group_check: false for this redeploy")
    if "timed out" in text.lower() or "timeout" in text.lower() or "connection refused" in text.lower():
        return (f"{host} (rank {s['rank']} of {s['world']}): the members did not all meet at the head's {where} "
                f"within {s['timeout']} s; {fix}")
    tail = " | ".join(line.strip() for line in text.strip().splitlines()[-3:])
    return f"{host} (rank {s['rank']} of {s['world']}): the group check at {where} failed (exit {rc}): {tail}"


def run(python: str, s: dict) -> tuple[int | None, str]:
    """Run CHECK_CODE with the venv's python and the member's environment; (exit code or None on time-out, output)."""
    env = dict(os.environ, **s["environment"])
    try:
        p = subprocess.run([python, "-c", CHECK_CODE, json.dumps(s)], capture_output=True, text=True,
                           timeout=s["timeout"] + START_SECONDS, env=env, check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out
    except OSError as e:
        return 127, str(e)
    return p.returncode, p.stdout + p.stderr


def parse(output: str) -> dict | None:
    """The last JSON object line of CHECK_CODE's output, or None."""
    for line in reversed((output or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict) and "seconds" in d:
                return d
    return None
