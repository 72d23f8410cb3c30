"""The `modelfleet` command line. Local commands (inspect, plan, plan-disk) call the same pure logic
the Ansible modules use; fleet commands drive playbooks through the runner wrapper."""

from __future__ import annotations

import argparse
import json
import re
import sys

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError

from modelfleet import __version__
from modelfleet.runner import InventoryError


def _emit(data: dict, as_json: bool, human) -> None:
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        human(data)


def cmd_inspect(a) -> int:
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import fmt_bytes

    facts = _inspect_source(a.source, a.revision, a.endpoint)
    if not a.files:
        facts["files"] = f"{len(facts['files'])} files (use --files to list)"

    def human(f):
        q = f["quantization"]
        print(f"{f['architecture']} ({f['model_type']}/{f['text_model_type']}), attention {f['attention']}, "
              f"{f['num_layers']} layers, hidden {f['hidden_size']}, experts {f['num_experts']} "
              f"(top-{f['experts_per_token']})")
        print(f"revision: {f['revision']}")
        print(f"shards: {f['num_shards']}, total {fmt_bytes(f['total_bytes'])}, parameters {f['num_parameters']}")
        print(f"quantization: {q['method']} bits={q['bits']} group={q['group_size']} symmetric={q['symmetric']} "
              f"format={q['format']} kv_cache_scheme={q['kv_cache_scheme']}")
        if f.get("quantized_tensors") is not None:
            print(f"quantized tensors: {f['quantized_tensors']} {f['quantized_by_kind']}; "
                  f"unquantized: {f['unquantized_tensors']} {f['unquantized_by_kind']}")
        for w in f["warnings"]:
            print(f"WARNING: {w}")
        for x in f["absent"]:
            print(f"absent: {x}")

    _emit(facts, a.json, human)
    return 0


def _inspect_source(source: str, revision: str | None, endpoint: str | None) -> dict:
    import os

    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.checkpoint import (
        inspect_hub,
        inspect_local,
    )

    if os.path.isdir(source) or source.startswith(("/", ".", "~")) or os.path.exists(source):
        return inspect_local(source, revision=revision)
    if "/" not in source:
        raise ModelfleetError(f"{source}: neither a local directory nor a hub repo id (org/name)")
    return inspect_hub(source, revision=revision or "main", endpoint=endpoint, token=os.environ.get("HF_TOKEN"))


def cmd_plan(a) -> int:
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.planner import plan
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.profiles import load_profile
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import GiB, fmt_bytes

    from modelfleet.collection import profiles_dir

    if a.gpus < 1:
        raise ModelfleetError(f"--gpus must be >= 1, got {a.gpus}")
    if not 0 < a.gpu_memory_gib < 1e6:  # also NaN and infinities
        raise ModelfleetError(f"--gpu-memory-gib must be a number of GiB > 0 (e.g. 96), got {a.gpu_memory_gib}")
    profile = load_profile(a.profile, str(profiles_dir())) if a.profile else None
    facts = _inspect_source(a.source, a.revision, a.endpoint)
    gpus = {"count": a.gpus, "memory_bytes": int(a.gpu_memory_gib * GiB), "interconnect": a.interconnect,
            "compute_capability": a.compute_capability}
    kw = dict(input_len=a.input_len, output_len=a.output_len, gpu_memory_utilization=a.gpu_memory_utilization,
              kv_cache_dtype=a.kv_cache_dtype)
    if a.hosts is None:
        result = plan(facts, gpus, profile, **kw)
    else:  # a group of that many hosts with these GPUs: one host, or pipeline (or data) parallel across them
        from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.group import layout

        if a.hosts < 1:
            raise ModelfleetError(f"--hosts must be >= 1, got {a.hosts}")
        result = layout(facts, [gpus] * a.hosts, profile, **kw)
    result["model"] = {"architecture": facts["architecture"], "attention": facts["attention"],
                       "revision": facts.get("revision"), "source": facts["source"]}

    def human(r):
        print(f"plan for {facts['architecture']} ({facts['attention']}) on {r['gpu_count']} x "
              f"{fmt_bytes(r['gpu_memory_bytes'])} ({r['interconnect']}), utilization {r['gpu_memory_utilization']}")
        if "layout" in r:
            print(f"  layout = {r['layout']} on {r['nodes']} host(s), pipeline_parallel_size = "
                  f"{r['pipeline_parallel_size']}, data_parallel_size = {r['data_parallel_size']}")
        print(f"  tensor_parallel_size = {r['tensor_parallel_size']}, expert_parallel = {r['expert_parallel']}")
        for k in ("weight_bytes_per_gpu", "kv_room_bytes_per_gpu"):
            print(f"  {k} = {fmt_bytes(r[k])}   [{r['formulas'][k]}]")
        print(f"  kv_bytes_per_token = {r['kv_bytes_per_token']} B ({r['kv_cache_dtype']}, "
              f"{r['kv_dtype_bytes']} B/elem)   [{r['formulas']['kv_bytes_per_token']}]")
        print(f"  kv_tokens_capacity = {r['kv_tokens_capacity']}   [{r['formulas']['kv_tokens_capacity']}]")
        print(f"  max_concurrency at {r['input_len']}+{r['output_len']} tokens = {r['max_concurrency']}")
        for x in r["reasons"]:
            print(f"  reason: {x}")
        for w in r["warnings"]:
            print(f"  WARNING: {w}")

    _emit(result, a.json, human)
    return 0 if result["fits"] else 1


def cmd_plan_disk(a) -> int:
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.disk import plan_host
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import fmt_bytes, parse_size

    try:
        need = parse_size(a.need_bytes)
        headroom = parse_size(a.headroom_bytes)
    except ValueError as e:
        raise ModelfleetError(f"--need-bytes/--headroom-bytes: {e}") from None
    plan = plan_host(root=a.root, required_bytes=need, headroom_bytes=headroom, headroom_percent=a.headroom_percent,
                     explicit=tuple(a.delete), protected=tuple(a.protect), in_use=tuple(a.in_use),
                     deploying=tuple(a.deploying), read_units=not a.no_units)
    fs = plan["filesystem"]

    def human(p):
        print(f"models root {p['root']} ({fs['source']}): free {fmt_bytes(p['free_bytes'])} of "
              f"{fmt_bytes(p['total_bytes'])}")
        print(f"need {fmt_bytes(p['need_bytes'])} (required {fmt_bytes(p['required_bytes'])} + headroom "
              f"{fmt_bytes(p['headroom_bytes'])}); shortfall {fmt_bytes(p['shortfall_bytes'])}")
        for d in p["delete"]:
            print(f"  delete now: {d['path']}  frees {fmt_bytes(d['bytes'])}")
        for d in p["delete_after_verify"]:
            print(f"  delete after the new model is verified: {d['path']}  frees {fmt_bytes(d['bytes'])}")
        for r in p["refused"]:
            print(f"  never: {r['path']} ({r['reason']})")
        for u in p["in_use"]:
            print(f"  in use: {u['path']} ({u['kind']} {u['name']})")
        if not p["units_read"]:
            print("  (the host's services were not read: --no-units)")
        print(p["message"])

    _emit(plan, a.json, human)
    return 0 if plan["feasible"] else 1


def _read_result(f):
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ModelfleetError(f"{f}: not a readable benchmark result ({e})") from None


def cmd_report(a) -> int:
    from pathlib import Path

    from modelfleet import report

    out = Path(a.out)
    if a.compare:
        results = {}
        for d in a.sources:
            files = sorted(Path(d).glob("*.json")) if Path(d).is_dir() else [Path(d)]
            for f in files:
                data = _read_result(f)
                if isinstance(data, dict) and "points" in data:
                    results[f.stem] = data
        if not results:
            raise ModelfleetError(f"no benchmark results (*.json with points) in {a.sources}")
        paths = report.write_comparison(results, out)
        if a.json:
            print(json.dumps(paths))
        else:
            print(Path(paths["md"]).read_text(), end="")
        return 0
    written = {}
    for src in a.sources:
        f = Path(src)
        result = _read_result(f)
        if not isinstance(result, dict) or not result.get("points"):
            raise ModelfleetError(f"{f}: has no benchmark points; pass a result written by vllm_bench/modelfleet bench")
        written[f.stem] = report.write_reports(result, out, f.stem)
    print(json.dumps(written[next(iter(written))] if len(written) == 1 else written))
    return 0


def _api_key(a) -> str:
    """The benchmark's API key from --api-key-file (owner-only mode, one line) or MODELFLEET_API_KEY."""
    import os

    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.secrets import read_secret_file

    if a.api_key_file:
        return read_secret_file(a.api_key_file, "--api-key-file")
    return os.environ.get("MODELFLEET_API_KEY", "").strip()


def cmd_bench(a) -> int:
    import time
    from pathlib import Path

    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench, bench_client

    from modelfleet import report

    if not a.url:
        return cmd_fleet_bench(a)
    if not a.model or not a.out:
        raise ModelfleetError("--url needs --model and --out (or leave --url out to benchmark the fleet)")
    levels = bench.sweep_levels(a.max_concurrency, a.levels)
    cfg = bench_client.default_config()
    cfg.update(base_url=a.url.rstrip("/"), model=a.model, api_key=_api_key(a), endpoint=a.endpoint,
               input_len=a.input_len, output_len=a.output_len, vocab_size=a.vocab_size, warmup=a.warmup,
               processes=a.processes, seed=a.seed, goodput_ttft_ms=a.goodput_ttft_ms,
               goodput_tpot_ms=a.goodput_tpot_ms, tokenizer=a.model_repo or None, workload=a.workload,
               prefix_len=a.prefix_len, turns=a.turns, server_pid=a.server_pid, stop_file=a.stop_file,
               thinking_budget=a.thinking_budget)

    def progress(p):
        if a.json:
            return
        flag = "" if p["valid"] else "  INVALID: " + "; ".join(p["invalid_reasons"])
        print(f"C={p['max_concurrency']:>4}  {p['output_throughput']:9.1f} out tok/s  TTFT p50 "
              f"{p['median_ttft_ms']:8.1f} ms  TPOT p50 {p['median_tpot_ms']:7.2f} ms  E2E p50 "
              f"{p['median_e2el_ms']:8.1f} ms  server/client tokens diff "
              f"{'-' if p['reconcile_diff'] is None else format(p['reconcile_diff'], '.2%')}"
              + (f"  TTFA p50 {p['median_ttfa_ms']:8.1f} ms" if "median_ttfa_ms" in p else "") + flag, flush=True)

    slo = {k: v for k, v in (("ttft_p99_ms", a.slo_ttft_p99_ms), ("tpot_p99_ms", a.slo_tpot_p99_ms),
                              ("e2el_p99_ms", a.slo_e2el_p99_ms)) if v is not None}
    if slo and not a.capacity:
        raise ModelfleetError("latency targets (--slo-*) are for a capacity search: add --capacity rate|concurrency")
    replicas = [_replica_url(u) for u in a.replica]
    if replicas and a.capacity:
        raise ModelfleetError("--replica compares a sweep through the endpoint with the replicas alone; a capacity "
                              "search (--capacity) runs against one URL: leave one of them out")
    if len(set(replicas)) != len(replicas):
        raise ModelfleetError(f"--replica names one replica twice: {', '.join(replicas)}")
    alone, rate = {}, a.request_rate or None
    for url in replicas:
        if not a.json:
            print(f"== {url} alone ==", flush=True)
        alone[url] = bench_client.run_sweep(dict(cfg, base_url=url), levels=levels,
                                            request_rate=rate, per_level=a.per_level,
                                            min_prompts=a.min_prompts, progress=progress, repeat=a.repeat)
    if replicas:
        n = len(replicas)
        # the endpoint at N times each point's load; its tokens counted by the replicas' own counters
        cfg["metrics_urls"] = replicas
        levels = [n * c for c in levels]
        rate = n * rate if rate else rate
        if not a.json:
            print(f"== {a.url} (the endpoint, {n} replica(s)) ==", flush=True)
    if a.capacity:
        def probe_line(p, meets, why):
            if not a.json:
                load = f"{p['offered_load']:g} {'req/s' if a.capacity == 'rate' else 'concurrent'}"
                print(f"{load:>16}: {p['request_throughput']:8.2f} req/s done, p99 TTFT {p['p99_ttft_ms']:8.1f} ms, "
                      f"p99 TPOT {p['p99_tpot_ms']:7.2f} ms - {'meets' if meets else 'misses: ' + '; '.join(why)}",
                      flush=True)

        result = bench_client.capacity_search(
            cfg, slo=slo, mode=a.capacity, start=a.start, maximum=a.maximum, repeat=a.repeat,
            probe_seconds=a.probe_seconds, per_level=a.per_level, min_prompts=a.min_prompts, progress=probe_line)
    else:
        result = bench_client.run_sweep(cfg, levels=levels, request_rate=rate,
                                        per_level=a.per_level, min_prompts=a.min_prompts, progress=progress,
                                        repeat=a.repeat)
    result["provenance"] = {"model_repo": a.model_repo or a.model, "revision": a.revision or "",
                            "endpoint": a.url, "benchmarked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    name = a.name or a.model
    if replicas:
        result["fleet_comparison"] = bench.fleet_comparison(result, alone)
        for i, url in enumerate(replicas, 1):
            alone[url]["provenance"] = dict(result["provenance"], endpoint=url)
            report.write_reports(alone[url], Path(a.out), f"{name}--replica-{i}")
    paths = report.write_reports(result, Path(a.out), name)
    if a.json:
        print(json.dumps({"headline": result["headline"], "knee": result["knee"], "capacity": result.get("capacity"),
                          "fleet_comparison": result.get("fleet_comparison"), "reports": paths}, indent=2))
    else:
        print(result["capacity"]["text"] if a.capacity else bench.headline_text(result))
        if replicas:
            print(result["fleet_comparison"]["text"])
        print(f"report: {paths['html']}")
    if a.capacity:  # a probe that misses the targets is what the search looks for, not a failure
        return 0 if result["capacity"]["capacity"] is not None else 1
    return 0 if all(p["valid"] for p in result["points"]) else 1


# ---------------------------------------------------------------- fleet commands (runner wrapper)

def _progress_lines(out=None, every_s: float = 10.0, clock=None):
    """For a log (stdout not a terminal): one line each time a host enters a phase (with its task), fails, or
    reports progress (download bytes/rate/ETA, the readiness wait; at most one such line per host every
    `every_s` seconds), with the seconds since the start - never a re-drawn table."""
    import contextlib
    import time

    out = out or sys.stdout
    clock = clock or time.monotonic
    t0 = clock()
    seen: dict = {}

    def on_event(ev, hosts):
        now = clock()
        for h in sorted(hosts.values(), key=lambda x: x.host):
            if not h.phase:
                continue
            last = seen.setdefault(h.host, {"phase": "", "failure": "", "detail": "", "progress_at": float("-inf")})
            line = ""
            if h.failure and h.failure != last["failure"]:
                # a failure a rescue handles (a rollback) gets its line too: the log says what happened
                line = f"FAILED in {h.phase}: {h.task[:80]}: {' '.join(h.failure.split())[:160]}"
            elif h.phase != last["phase"]:
                # a role's first task is Ansible's own argument check: the phase alone says as much
                check = h.task.startswith("Validating arguments against arg spec")
                line = h.phase if check else f"{h.phase}: {h.task[:80]}"
            elif h.detail and h.detail != last["detail"] and now - last["progress_at"] >= every_s:
                line = f"{h.phase}: {h.detail[:160]}"
                last.update(detail=h.detail, progress_at=now)  # the throttle is between progress lines only
            last.update(phase=h.phase, failure=h.failure)
            if line:
                print(f"[{now - t0:6.0f} s] {h.host:<14} {line}", file=out, flush=True)

    return contextlib.nullcontext(), on_event


def _progress(a):
    """A live per-host table (phase, last task, last progress line) on a terminal (or with --progress); progress
    lines when stdout is a log; nothing with --json."""
    if a.json:
        return None, None
    if not sys.stdout.isatty() and not getattr(a, "progress", False):
        return _progress_lines()
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    console = Console()

    def table(hosts):
        t = Table(title="modelfleet", expand=True)
        for c in ("host", "phase", "task", "progress", "ok", "changed", "failed"):
            t.add_column(c, overflow="fold")
        for h in sorted(hosts.values(), key=lambda x: x.host):
            t.add_row(h.host, h.phase, h.task[:60], h.detail[:70], str(h.ok), str(h.changed),
                      str(h.failed or ""))
        return t

    live = Live(table({}), console=console, refresh_per_second=4, transient=False)

    def on_event(ev, hosts):
        live.update(table(hosts))

    return live, on_event


def _run_with_progress(a, fn):
    live, on_event = _progress(a)
    if live is None:
        return fn(None)
    with live:
        return fn(on_event)


def _report_run(a, res) -> int:
    data = res.to_dict()
    if a.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        for h in sorted(res.hosts.values(), key=lambda x: x.host):
            line = f"{h.host}: {h.status} (phases: {' > '.join(h.phases) or '-'}; ok={h.ok} changed={h.changed})"
            print(line)
            for k, v in sorted(h.facts.items()):
                if k in ("modelfleet_deploy_outcome", "modelfleet_status_outcome", "benchmark_outcome"):
                    print(f"  {k}: {json.dumps(v, default=str)[:400]}")
            if h.failure:
                print(f"  failure: {h.failure[:600]}")
        print(f"run {res.run_id}: {res.status}, rc={res.rc}, {res.duration_s} s; artifacts: {res.run_dir}")
    return 0 if res.ok else 1


def _extravars(a) -> dict:
    ev = {}
    for item in a.extra or []:
        if item.startswith("@"):
            import yaml

            ev.update(yaml.safe_load(open(item[1:])) or {})
        else:
            k, sep, v = item.partition("=")
            if not sep:
                raise ModelfleetError(f"-e {item}: use key=value or @file.yml")
            ev[k] = v
    return ev


def cmd_deploy(a) -> int:
    from modelfleet import runner

    res = _run_with_progress(a, lambda cb: runner.deploy(a.profile, a.inventory, a.limit, a.check, _extravars(a), cb,
                                                         playbook=a.playbook))
    if not a.json:
        _deploy_summary(res)
    return _report_run(a, res)


def _deploy_summary(res) -> None:
    """One screen: the rollout plan, then per host the phase reached, revision, source and bytes, time per phase,
    benchmark headline."""
    local = res.hosts.get("localhost")
    plan = local.facts.get("modelfleet_rollout_plan") if local else None
    if plan:
        print("\n== rollout plan ==")
        print(plan["text"])
        if plan.get("left_out"):
            print("not in this run (another profile): " + ", ".join(plan["left_out"]))
    print("\n== deploy summary ==")
    for h in sorted(res.hosts.values(), key=lambda x: x.host):
        if h.host == "localhost":
            continue
        d = h.facts.get("modelfleet_deploy_outcome") or {}
        bench = d.get("benchmark") or {}
        times = ", ".join(f"{k} {v:.0f}s" for k, v in h.phase_seconds.items())
        print(f"{h.host:<12} {h.status:<8} reached {h.phase or '-':<12} rev {str(d.get('revision', '-'))[:12]:<12} "
              f"from {d.get('fetched_from', '-')}, {d.get('bytes', '-')} B"
              + ("  (up to date: fetch, environment and unit skipped)" if d.get("up_to_date") else ""))
        split = ", ".join(f"{k[:-2]} {v}s" for k, v in (d.get("timings") or {}).items() if v not in (None, ""))
        print(f"{'':<12} time: {times or '-'}" + (f" ({split})" if split else ""))
        if bench:
            print(f"{'':<12} bench: single {bench.get('single_stream_output_tok_s') or 0:.1f} tok/s, peak "
                  f"{bench.get('peak_output_tok_s') or 0:.1f} tok/s at C={bench.get('peak_concurrency')}")
        if d.get("report"):
            print(f"{'':<12} report: {d['report']} (+ .png)")
        if h.failure:
            print(f"{'':<12} failed: {h.failure[:300]}")


def cmd_status(a) -> int:
    from modelfleet import runner

    res = _run_with_progress(a, lambda cb: runner.status(a.inventory, a.limit, cb))
    if not a.json:
        for h in sorted(res.hosts.values(), key=lambda x: x.host):
            st = h.facts.get("modelfleet_status_outcome") or {}
            serving = [f"{u['served_model_name']}@{(u.get('revision') or '')[:12]} ({u['state']})"
                       for u in st.get("serving", [])]
            lb = (st.get("last_benchmark") or {}).get("headline") or {}
            print(f"{h.host}: {h.status}; serving {', '.join(serving) or 'nothing'}; "
                  f"units {len(st.get('units', []))}; models on disk {len(st.get('models', []))}; last benchmark "
                  f"{'-' if not lb else format(lb.get('peak_output_tok_s') or 0, '.1f') + ' tok/s peak'}")
        print(f"run {res.run_id}: {res.status}; artifacts: {res.run_dir}")
        return 0 if res.ok else 1
    return _report_run(a, res)


def _replica_url(url: str) -> str:
    if not re.match(r"^https?://[^/\s]+/?$", url or ""):
        raise ModelfleetError(f"--replica {url!r}: give a replica's base URL, e.g. http://10.0.0.11:8000")
    return url.rstrip("/")


def cmd_fleet_bench(a) -> int:
    from modelfleet import runner

    res = _run_with_progress(a, lambda cb: runner.bench(a.inventory, a.limit, _extravars(a), cb))
    return _report_run(a, res)


def cmd_demo(a) -> int:
    import subprocess

    from modelfleet.collection import checkout

    repo = checkout()
    if repo is None:
        print("modelfleet demo: the demo runs from a git checkout (it builds the local fleet's containers): "
              "git clone the project and run scripts/demo.sh there", file=sys.stderr)
        return 2
    return subprocess.call([str(repo / "scripts" / "demo.sh"), *a.args])


def build_parser() -> argparse.ArgumentParser:
    # no abbreviations: `--api-key` must not silently mean `--api-key-file`, nor `--del` mean `--delete`
    ap = argparse.ArgumentParser(prog="modelfleet", description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--version", action="version", version=f"modelfleet {__version__}")
    sub = ap.add_subparsers(dest="command")

    def add(name, **kw):
        return sub.add_parser(name, allow_abbrev=False, **kw)

    p = add("inspect", help="facts about a checkpoint (local dir or hub repo), headers only")
    p.add_argument("source", help="a local checkpoint directory or a hub repo id (org/name)")
    p.add_argument("--revision", help="branch, tag or commit (hub); default main")
    p.add_argument("--endpoint", help="hub endpoint (default: HF_ENDPOINT or the public hub)")
    p.add_argument("--files", action="store_true", help="list every file with size and sha256")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)

    p = add("plan", help="TP/EP and KV-cache room for a checkpoint on given GPUs")
    p.add_argument("source", help="a local checkpoint directory or a hub repo id (org/name)")
    p.add_argument("--gpus", type=int, required=True, help="GPU count")
    p.add_argument("--gpu-memory-gib", type=float, required=True, help="memory of each GPU, GiB")
    p.add_argument("--hosts", type=int, default=None,
                   help="plan for a group of this many such hosts: one host while the model fits, else pipeline "
                        "parallel across hosts (or the profile's vllm.multi_host layout)")
    p.add_argument("--interconnect", choices=["pcie", "nvlink", "mixed", "single"], default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--compute-capability", default=None, help="e.g. 12.0 (RTX PRO 6000 Blackwell), 9.0 (H100/H200)")
    p.add_argument("--kv-cache-dtype", default=None)
    p.add_argument("--profile", help="a profile name from profiles/ (or a path)")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--revision")
    p.add_argument("--endpoint")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = add("plan-disk", help="which model directories to delete to make room (deletes nothing)")
    p.add_argument("--root", required=True, help="the models root")
    p.add_argument("--need-bytes", required=True, help="bytes needed: an integer, or e.g. 595GB / 554GiB")
    p.add_argument("--headroom-bytes", default="0")
    p.add_argument("--headroom-percent", type=float, default=0.0)
    p.add_argument("--delete", action="append", default=[], metavar="PATH", help="delete this first (repeatable)")
    p.add_argument("--protect", action="append", default=[], metavar="PATH")
    p.add_argument("--in-use", action="append", default=[], metavar="PATH")
    p.add_argument("--deploying", action="append", default=[], metavar="PATH")
    p.add_argument("--no-units", action="store_true",
                   help="do not read the host's services (the explicit opt-out: without it a plan fails when "
                        "systemd cannot be read)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan_disk)

    p = add("report", help="JSON/CSV/PNG/HTML reports from benchmark results, or a comparison")
    p.add_argument("sources", nargs="+", help="result JSON files (or, with --compare, folders of them)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--compare", action="store_true", help="one comparison table across all results")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report)

    p = add("bench", help="concurrency sweep against an endpoint (--url) or every host of the fleet")
    p.add_argument("--url", default=None, help="base URL, e.g. http://127.0.0.1:8000 (without it: the fleet)")
    p.add_argument("--model", default=None, help="served model name (with --url)")
    p.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="a file holding the API key (mode 0600 or stricter); or set MODELFLEET_API_KEY. A key is "
                        "never taken on the command line, where every user sees it in ps")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=0, help="token-id prompts of exact length (completions)")
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--levels", type=int, nargs="*", default=None)
    p.add_argument("--request-rate", type=float, default=0.0, help="Poisson rate per point; 0 = closed loop")
    p.add_argument("--per-level", type=int, default=4)
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of every point; from 2 each point carries its throughputs' 95%% confidence interval")
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--goodput-ttft-ms", type=float, default=None)
    p.add_argument("--goodput-tpot-ms", type=float, default=None)
    p.add_argument("--workload", choices=["random", "shared-prefix", "multi-turn"], default="random",
                   help="shared-prefix: every prompt starts with the same --prefix-len tokens (prefix-cache hits "
                        "are recorded per point); multi-turn: sessions of --turns requests after that shared system "
                        "prompt, each sent after the answer to the one before with the conversation so far (a "
                        "point's prompt count is then its sessions)")
    p.add_argument("--prefix-len", type=int, default=0, help="tokens of the shared prefix (0: half the input)")
    p.add_argument("--turns", type=int, default=3, help="multi-turn: requests per session")
    p.add_argument("--thinking-budget", type=int, default=None, metavar="TOKENS",
                   help="a reasoning model's thinking per request (vLLM's thinking_token_budget; --endpoint chat, a "
                        "server with a reasoning parser and --reasoning-config); unset: the model ends it itself")
    p.add_argument("--stop-file", default=None, metavar="PATH",
                   help="stop sending when PATH exists (the requests in flight finish): a load that lasts as long "
                        "as something else, e.g. a rolling switch through the fleet endpoint")
    p.add_argument("--replica", action="append", default=[], metavar="URL",
                   help="with --url a fleet endpoint: a replica behind it (repeat for each). Each is measured alone "
                        "first, then the endpoint at N times each point's load, compared with their sum; the "
                        "endpoint's tokens are reconciled with the replicas' counters")
    p.add_argument("--server-pid", type=int, default=0,
                   help="telemetry: the server's main PID on this host (its process tree's CPU is sampled)")
    p.add_argument("--capacity", choices=["rate", "concurrency"], default=None,
                   help="search the highest Poisson rate (or concurrency) that meets the --slo-* latency targets")
    p.add_argument("--slo-ttft-p99-ms", type=float, default=None)
    p.add_argument("--slo-tpot-p99-ms", type=float, default=None)
    p.add_argument("--slo-e2el-p99-ms", type=float, default=None)
    p.add_argument("--start", type=float, default=1.0, help="capacity: the first load tried (req/s or concurrency)")
    p.add_argument("--maximum", type=float, default=256.0, help="capacity: the highest load tried")
    p.add_argument("--probe-seconds", type=float, default=20.0, help="capacity (rate): about how long each probe runs")
    p.add_argument("--model-repo", default=None, help="for the provenance")
    p.add_argument("--revision", default=None, help="for the provenance")
    p.add_argument("--name", default=None, help="report file name (default: the model)")
    p.add_argument("--out", default=None, help="output folder (with --url)")
    p.add_argument("-i", "--inventory", default=None, help="fleet mode: inventory")
    p.add_argument("-l", "--limit", default=None, help="fleet mode: host pattern")
    p.add_argument("-e", "--extra", action="append", metavar="KEY=VALUE|@FILE", help="fleet mode: extra variables")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    def fleet_args(p):
        p.add_argument("-i", "--inventory", default=None, help="inventory (*.fleet.yml or a folder)")
        p.add_argument("-l", "--limit", default=None, help="host pattern")
        p.add_argument("-e", "--extra", action="append", metavar="KEY=VALUE|@FILE", help="extra variables")
        p.add_argument("--json", action="store_true", help="the run result as JSON (no live display)")
        p.add_argument("--progress", action="store_true", help="live display even when not on a terminal")

    p = add("deploy", help="deploy the fleet to what its fleet file declares (each group its profile, the rollout's "
                           "waves in order, canary first); --check prints the wave plan and what would change")
    p.add_argument("profile", nargs="?", default=None,
                   help="a profile name from profiles/: only the hosts that declare it (and those that declare none)")
    p.add_argument("--check", action="store_true", help="Ansible check mode: show what would change, change nothing")
    p.add_argument("--playbook", default="deploy_model.yml", help="deploy_model.yml or one that imports it")
    fleet_args(p)
    p.set_defaults(func=cmd_deploy)

    p = add("status", help="what each host serves: units, revision, models on disk, last benchmark")
    fleet_args(p)
    p.set_defaults(func=cmd_status)

    p = add("demo", help="the local fleet demo (scripts/demo.sh)")
    p.add_argument("args", nargs="*")
    p.set_defaults(func=cmd_demo)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if not getattr(a, "func", None):
        ap.print_help()
        return 2
    try:
        return a.func(a)
    except (ModelfleetError, InventoryError, FileNotFoundError) as e:
        print(f"modelfleet {a.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"modelfleet {a.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: one line for the user, the traceback on request
        import os
        import traceback

        if os.environ.get("MODELFLEET_DEBUG"):
            traceback.print_exc()
        print(f"modelfleet {a.command}: internal error: {type(e).__name__}: {e} (a modelfleet bug: please report "
              "it with the command line; MODELFLEET_DEBUG=1 prints the traceback)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
