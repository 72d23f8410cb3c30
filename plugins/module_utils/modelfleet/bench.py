"""Benchmark arithmetic: per-request records -> metrics, server-counter reconciliation, client-saturation
checks, the knee of a sweep, and baseline gates. Pure functions over plain data; the client that produces
the records is bench_client.py.

A request record (one streamed request) is a dict:
    start, end          monotonic seconds; start is the request's scheduled arrival in an open-loop run (so the
                        latency includes any wait for a client slot), else the moment it was sent
    sent                when it went out (optional; sent - start is the client queue time)
    chunk_times         monotonic seconds of every streamed chunk that carried a generation step
    prompt_tokens       from the server's usage field
    completion_tokens   from the server's usage field
    error               "" on success, else the reason
    reasoning_steps     chat: the chunks that carried reasoning (a reasoning model's thinking)
    answer_at           chat: when the first chunk of the answer (content or a tool call) came, or None
    server_reasoning_tokens  chat: the server's usage.completion_tokens_details.reasoning_tokens, when sent

Field names of a point follow `vllm bench serve --save-result` where the meaning is the same
(mean_ttft_ms, p99_itl_ms, output_throughput, ...). FORMULAS is stored in every result.
"""

from __future__ import annotations

import functools
import math
import re

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError


class BenchError(ModelfleetError):
    """Bad benchmark inputs, or a benchmark that could not run (the message says which and the fix)."""


FORMULAS = {
    "ttft_ms": "time of the first streamed generation chunk - request start",
    "tpot_ms": "(e2el - ttft) / (completion_tokens - 1), requests with completion_tokens > 1",
    "itl_ms": "gap between consecutive streamed generation chunks, all requests pooled",
    "e2el_ms": "request end (last byte) - request start",
    "output_throughput": "sum(completion_tokens) / duration  [tok/s]",
    "total_token_throughput": "(sum(prompt_tokens) + sum(completion_tokens)) / duration  [tok/s]",
    "request_throughput": "completed requests / duration  [req/s]",
    "request_goodput": "requests with ttft <= goodput_ttft_ms and tpot <= goodput_tpot_ms / duration  [req/s]",
    "output_tokens_per_user_s": "mean over requests of (completion_tokens - 1) / (e2el - ttft)  [tok/s]",
    "duration": "last request end - first request start (after warm-up)  [s]",
    "token_counts": "from the server's usage field (stream_options.include_usage); no client tokenizer",
    "server_generation_tokens": "delta of vllm:generation_tokens_total across the point",
    "reconcile_diff": "|client completion tokens - server_generation_tokens| / server_generation_tokens",
    "prefix_cache_hit_rate": "delta vllm:prefix_cache_hits_total / delta vllm:prefix_cache_queries_total (prompt "
                             "tokens found in the prefix cache / looked up) across the point",
    "percentiles": "linear interpolation between closest ranks (numpy's default)",
    "ttfa_ms": "reasoning streams: time of the first streamed answer chunk (content or tool call, after the "
               "reasoning) - request start; requests whose answer began",
    "reasoning_share": "reasoning streams: chunks that carried reasoning / all generation chunks",
}

PERCENTILES = (50, 90, 99)
RECONCILE_TOLERANCE = 0.02


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks; 0.0 for an empty list."""
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return float(s[lo])
    return float(s[lo] + (s[hi] - s[lo]) * (k - lo))


def _stats(prefix: str, values_ms: list[float]) -> dict:
    n = len(values_ms)
    mean = sum(values_ms) / n if n else 0.0
    var = sum((v - mean) ** 2 for v in values_ms) / n if n else 0.0
    out = {f"mean_{prefix}_ms": mean, f"median_{prefix}_ms": percentile(values_ms, 50),
           f"std_{prefix}_ms": math.sqrt(var)}
    for p in PERCENTILES:
        out[f"p{p}_{prefix}_ms"] = percentile(values_ms, p)
    return out


def request_timings(rec: dict) -> dict:
    """ttft, tpot, e2el (seconds) and the ITL gaps of one successful request."""
    chunks = rec.get("chunk_times") or []
    start, end = rec["start"], rec["end"]
    ttft = (chunks[0] - start) if chunks else (end - start)
    e2el = end - start
    n = rec.get("completion_tokens") or 0
    tpot = (e2el - ttft) / (n - 1) if n > 1 else None
    itls = [b - a for a, b in zip(chunks, chunks[1:], strict=False)]
    return {"ttft": ttft, "tpot": tpot, "e2el": e2el, "itls": itls}


def point_metrics(records: list[dict], *, goodput_ttft_ms: float | None = None,
                  goodput_tpot_ms: float | None = None) -> dict:
    """Metrics of one benchmark point from its request records (warm-up requests excluded by the caller)."""
    if not records:
        raise BenchError("no requests were recorded for this point; raise num_prompts")
    ok = [r for r in records if not r.get("error")]
    failed = [r for r in records if r.get("error")]
    t_first = min(r["start"] for r in records)
    t_last = max(r["end"] for r in records)
    duration = max(t_last - t_first, 1e-9)
    ttfts, tpots, itls, e2els, per_user = [], [], [], [], []
    queues = [(r["sent"] - r["start"]) * 1000 for r in ok if "sent" in r]
    good = 0
    for r in ok:
        t = request_timings(r)
        ttfts.append(t["ttft"] * 1000)
        e2els.append(t["e2el"] * 1000)
        itls.extend(g * 1000 for g in t["itls"])
        if t["tpot"] is not None:
            tpots.append(t["tpot"] * 1000)
            if t["e2el"] > t["ttft"]:
                per_user.append((r["completion_tokens"] - 1) / (t["e2el"] - t["ttft"]))
        meets = ((goodput_ttft_ms is None or t["ttft"] * 1000 <= goodput_ttft_ms)
                 and (goodput_tpot_ms is None or (t["tpot"] or 0) * 1000 <= goodput_tpot_ms))
        good += 1 if meets else 0
    total_in = sum(r.get("prompt_tokens") or 0 for r in ok)
    total_out = sum(r.get("completion_tokens") or 0 for r in ok)
    m = {
        "completed": len(ok),
        "failed": len(failed),
        "errors": sorted({r["error"] for r in failed})[:10],
        "duration": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": good / duration if (goodput_ttft_ms or goodput_tpot_ms) else None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "output_tokens_per_user_s": sum(per_user) / len(per_user) if per_user else 0.0,
        "input_lens": [r.get("prompt_tokens") or 0 for r in ok],
        "output_lens": [r.get("completion_tokens") or 0 for r in ok],
    }
    m.update(_stats("ttft", ttfts))
    m.update(_stats("tpot", tpots))
    m.update(_stats("itl", itls))
    m.update(_stats("e2el", e2els))
    if queues:  # the time requests waited in the client before going out (included in ttft and e2el)
        m.update(_stats("queue", queues))
    m.update(reasoning_metrics(ok))
    # error bars of the mean latencies over this point's requests (Student-t, 95%)
    m.update(ci_ttft_ms=mean_ci(ttfts), ci_tpot_ms=mean_ci(tpots), ci_e2el_ms=mean_ci(e2els))
    return m


def reasoning_metrics(ok: list[dict]) -> dict:
    """A reasoning model's streams: how much of the generation was reasoning, and the time to the first token of
    the answer (TTFT counts the first reasoning token: a user waits for the answer). {} when no stream reasoned.
    The server's own count of reasoning tokens is kept beside the client's: vLLM counts only tokens between a
    generated <think> and </think>, so for a model whose template opens the reasoning in the prompt it says 0."""
    reasoned = [r for r in ok if r.get("reasoning_steps")]
    if not reasoned:
        return {}
    steps = sum(r["reasoning_steps"] for r in ok)
    chunks = sum(len(r.get("chunk_times") or ()) for r in ok)
    answered = [r for r in reasoned if r.get("answer_at") is not None]
    server = [r["server_reasoning_tokens"] for r in ok if r.get("server_reasoning_tokens") is not None]
    m = {"reasoning": {"requests": len(reasoned), "answered": len(answered), "reasoning_steps": steps,
                       "answer_steps": chunks - steps, "reasoning_share": steps / chunks if chunks else 0.0,
                       "server_reasoning_tokens": sum(server) if server else None}}
    if answered:
        m.update(_stats("ttfa", [(r["answer_at"] - r["start"]) * 1000 for r in answered]))
    return m


# ---- server metrics (Prometheus text format) ----

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) for every sample line of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        try:
            out.append((m.group(1), labels, float(m.group(3))))
        except ValueError:
            continue
    return out


def metric_sum(samples: list[tuple[str, dict, float]], name: str, model: str | None = None) -> float | None:
    """Sum of a metric over its label sets (optionally one model_name); None when absent."""
    vals = [v for n, lab, v in samples if n == name and (model is None or lab.get("model_name", model) == model)]
    return sum(vals) if vals else None


def _metrics_model(samples: list, model: str | None) -> str | None:
    """The model_name label to read for a request's model name. vLLM labels every metric with the first of the
    names it serves, so a client that uses another (an alias: a fleet endpoint's model name) finds none of its
    own; one server serves one model, so its one label is that model's. Several labels and none of them the
    name: the name stays, and nothing is read (a point is never reconciled against another model)."""
    if model is None:
        return None
    labels = {lab["model_name"] for n, lab, _dummy in samples if n.startswith("vllm:") and "model_name" in lab}
    return model if model in labels or len(labels) != 1 else labels.pop()


def server_snapshot(text: str, model: str | None = None) -> dict:
    """The counters and gauges the truth checks and the knee need, from one /metrics scrape."""
    s = parse_prometheus(text)
    model = _metrics_model(s, model)
    kv = metric_sum(s, "vllm:kv_cache_usage_perc", model)
    if kv is None:
        kv = metric_sum(s, "vllm:gpu_cache_usage_perc", model)
    info = [lab for n, lab, _dummy in s if n == "vllm:cache_config_info"]
    blocks = block_size = None
    if info:
        try:
            blocks = int(info[0].get("num_gpu_blocks") or 0) or None
            block_size = int(info[0].get("block_size") or 0) or None
        except ValueError:
            pass
    return {
        "generation_tokens_total": metric_sum(s, "vllm:generation_tokens_total", model),
        "prompt_tokens_total": metric_sum(s, "vllm:prompt_tokens_total", model),
        "requests_running": metric_sum(s, "vllm:num_requests_running", model),
        "requests_waiting": metric_sum(s, "vllm:num_requests_waiting", model),
        "kv_cache_usage": kv,
        "preemptions_total": metric_sum(s, "vllm:num_preemptions_total", model),
        "prefix_cache_queries_total": metric_sum(s, "vllm:prefix_cache_queries_total", model),
        "prefix_cache_hits_total": metric_sum(s, "vllm:prefix_cache_hits_total", model),
        "kv_tokens_capacity": blocks * block_size if blocks and block_size else None,
    }


# counters and gauges that add up across servers; the rest of a snapshot is the most any one of them shows
_SUMMED = ("generation_tokens_total", "prompt_tokens_total", "requests_running", "requests_waiting",
           "preemptions_total", "prefix_cache_queries_total", "prefix_cache_hits_total", "kv_tokens_capacity")


def combine_snapshots(snaps: list) -> dict:
    """Several servers' snapshots as one (the replicas behind a fleet endpoint): counters, request gauges and KV
    capacity summed, KV usage the highest; a figure one server lacks is None, so a point is never reconciled
    against part of the fleet."""
    if not snaps:
        raise BenchError("no server snapshot to combine")
    if len(snaps) == 1:
        return dict(snaps[0])
    out = {}
    for key in set().union(*snaps):
        values = [s.get(key) for s in snaps]
        if any(v is None for v in values):
            out[key] = None
        else:
            out[key] = sum(values) if key in _SUMMED else max(values)
    return out


def fleet_comparison(endpoint: dict, alone: dict) -> dict:
    """The fleet through its endpoint against the sum of its replicas measured alone, point by point: the
    endpoint's point i carries N times the load of each replica's point i (N replicas; concurrency or request
    rate), so a balancer that adds nothing and spreads evenly gives a ratio of 1. `alone` is {replica: result}.
    With repeated runs the sum's interval is the root of the squared half-widths (independent runs), and the
    endpoint is called different from the sum only when the intervals say so."""
    names = sorted(alone)
    if not names:
        raise BenchError("no replica measured alone to compare the endpoint with")
    n = len(names)
    rows = []
    for i, ep in enumerate(endpoint.get("points") or []):
        per = [(alone[r].get("points") or [])[i] if i < len(alone[r].get("points") or []) else None for r in names]
        if any(p is None for p in per):
            raise BenchError(f"replica point {i + 1} missing: every replica is measured at every level")
        total = sum(p["output_throughput"] for p in per)
        halves = [(p.get("ci_output_throughput") or {}).get("half_width") for p in per]
        sum_ci = ({"half_width": math.sqrt(sum(h * h for h in halves)), "low": None, "high": None}
                  if all(h is not None for h in halves) else {"half_width": None})
        if sum_ci["half_width"] is not None:
            sum_ci.update(low=total - sum_ci["half_width"], high=total + sum_ci["half_width"])
        rows.append({
            "replica_concurrency": per[0].get("max_concurrency"), "replica_request_rate": per[0].get("request_rate"),
            "endpoint_concurrency": ep.get("max_concurrency"), "endpoint_request_rate": ep.get("request_rate"),
            "endpoint_output_tok_s": ep["output_throughput"],
            "replicas_output_tok_s": {r: p["output_throughput"] for r, p in zip(names, per, strict=True)},
            "sum_output_tok_s": total,
            "ratio": ep["output_throughput"] / total if total else None,
            "different": differ(ep.get("ci_output_throughput") or {}, sum_ci),
            "endpoint_p99_ttft_ms": ep.get("p99_ttft_ms"),
            "replicas_p99_ttft_ms_max": max((p.get("p99_ttft_ms") or 0) for p in per),
            "endpoint_failed": ep.get("failed") or 0,
            "valid": bool(ep.get("valid", True)) and all(p.get("valid", True) for p in per),
        })
    return {"replicas": names, "n": n, "rows": rows, "text": fleet_comparison_text(names, rows)}


def fleet_comparison_text(names: list, rows: list) -> str:
    lines = [f"through the endpoint vs the sum of {len(names)} replica(s) alone ({', '.join(names)}):"]
    for r in rows:
        load = (f"C={r['endpoint_concurrency']} (each replica alone at C={r['replica_concurrency']})"
                if r["endpoint_concurrency"] else
                f"{r['endpoint_request_rate']} req/s (each alone at {r['replica_request_rate']} req/s)")
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        verdict = {True: ", different", False: ", not different", None: ""}[r["different"]]
        lines.append(f"  {load}: {r['endpoint_output_tok_s']:.1f} out tok/s vs {r['sum_output_tok_s']:.1f} summed "
                     f"({ratio}{verdict}); p99 TTFT {r['endpoint_p99_ttft_ms'] or 0:.1f} ms vs "
                     f"{r['replicas_p99_ttft_ms_max']:.1f} ms at worst alone"
                     + ("" if r["valid"] else "  INVALID point (see each result)"))
    return "\n".join(lines)


def prefix_cache(before: dict, after: dict) -> dict:
    """The server's prefix cache across a point: prompt tokens looked up and found (vLLM's counters), and the
    share found; None where the server exposes no such counter."""
    q0, q1 = before.get("prefix_cache_queries_total"), after.get("prefix_cache_queries_total")
    h0, h1 = before.get("prefix_cache_hits_total"), after.get("prefix_cache_hits_total")
    if None in (q0, q1, h0, h1):
        return {"prefix_cache_queries": None, "prefix_cache_hits": None, "prefix_cache_hit_rate": None}
    q, h = q1 - q0, h1 - h0
    return {"prefix_cache_queries": q, "prefix_cache_hits": h, "prefix_cache_hit_rate": h / q if q else None}


def reconcile(client_output_tokens: int, before: dict, after: dict,
              tolerance: float = RECONCILE_TOLERANCE) -> dict:
    """Client token count vs the server's generation counter across a point."""
    b, a = before.get("generation_tokens_total"), after.get("generation_tokens_total")
    if a is None or b is None:
        return {"server_generation_tokens": None, "reconcile_diff": None, "reconciled": None,
                "reconcile_note": "the server exposes no vllm:generation_tokens_total; not reconciled"}
    server = a - b
    diff = abs(client_output_tokens - server) / server if server else (0.0 if client_output_tokens == 0 else 1.0)
    ok = diff <= tolerance
    note = "" if ok else (f"client counted {client_output_tokens} output tokens, the server {server:.0f} "
                          f"({diff:.1%} apart, tolerance {tolerance:.0%}): another client used the server "
                          "during the point, or requests were cut short")
    return {"server_generation_tokens": server, "reconcile_diff": diff, "reconciled": ok, "reconcile_note": note}


def client_health(cpu_fraction: list[float], loop_lag_ms: list[float], *, max_cpu_fraction: float = 0.9,
                  max_lag_p99_ms: float = 25.0) -> dict:
    """Whether the client (not the server) was the bottleneck: any client process near a full core, or
    event-loop lag (a 10 ms ticker's overshoot) with p99 above the limit."""
    lag_p99 = percentile(loop_lag_ms, 99)
    cpu_max = max(cpu_fraction) if cpu_fraction else 0.0
    reasons = []
    if cpu_max >= max_cpu_fraction:
        reasons.append(f"a client process used {cpu_max:.0%} of a core (limit {max_cpu_fraction:.0%}); "
                       "use more client processes (bench processes)")
    if lag_p99 > max_lag_p99_ms:
        reasons.append(f"client event-loop lag p99 {lag_p99:.1f} ms > {max_lag_p99_ms:.0f} ms: timings "
                       "include client delay; use more client processes or fewer concurrent streams per process")
    return {"client_cpu_fraction_max": cpu_max, "client_loop_lag_p99_ms": lag_p99,
            "client_loop_lag_max_ms": max(loop_lag_ms) if loop_lag_ms else 0.0,
            "client_bound": bool(reasons), "client_reasons": reasons}


# ---- sweeps ----

def sweep_levels(max_concurrency: int, levels: list[int] | None = None) -> list[int]:
    """1, 2, 4, ... up to max_concurrency (inclusive, the bound added when it is not a power of two)."""
    if levels:
        bad = [x for x in levels if not isinstance(x, int) or isinstance(x, bool) or x < 1]
        if bad:
            raise BenchError(f"concurrency levels must be positive integers, got {bad}")
        return sorted(set(levels))
    if not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise BenchError(f"max concurrency must be a positive integer, got {max_concurrency!r}")
    out, c = [], 1
    while c < max_concurrency:
        out.append(c)
        c *= 2
    out.append(max_concurrency)
    return out


def num_prompts_for(concurrency: int, *, per_level: int = 4, minimum: int = 8, maximum: int = 2000) -> int:
    """Prompts per point, scaled with concurrency so each slot runs several requests."""
    return max(minimum, min(maximum, concurrency * per_level))


def kv_bound(kv_tokens_capacity: int | None, input_len: int, output_len: int) -> int | None:
    """How many requests of this shape fit in the KV cache at once (None when the capacity is unknown)."""
    if not kv_tokens_capacity:
        return None
    return max(kv_tokens_capacity // (input_len + output_len), 0)


def find_knee(points: list[dict], *, min_gain: float = 0.10) -> dict:
    """Where output throughput stops rising over a concurrency sweep, and the likely cause.

    Only valid points count. The plateau starts at the first point whose throughput gain over the previous
    one is below min_gain x the relative increase in concurrency (for a doubling, 10% by default); the knee
    is the point before it. The cause is read from the server's gauges at the plateau point."""
    pts = sorted((p for p in points if p.get("valid", True)), key=lambda p: p["max_concurrency"])
    if len(pts) < 2:
        return {"knee_concurrency": None, "plateau_concurrency": None, "cause": None,
                "summary": "fewer than two valid points: no knee can be read"}
    for prev, cur in zip(pts, pts[1:], strict=False):
        c_gain = cur["max_concurrency"] / prev["max_concurrency"] - 1
        t_prev = prev["output_throughput"] or 1e-9
        gain = cur["output_throughput"] / t_prev - 1
        lat_rise = cur.get("median_e2el_ms", 0) > prev.get("median_e2el_ms", 0)
        if gain < min_gain * c_gain and lat_rise:
            cause, why = _cause(cur)
            return {"knee_concurrency": prev["max_concurrency"], "plateau_concurrency": cur["max_concurrency"],
                    "throughput_gain": gain, "cause": cause,
                    "summary": (f"throughput stops rising after C={prev['max_concurrency']} "
                                f"({prev['output_throughput']:.1f} -> {cur['output_throughput']:.1f} tok/s at "
                                f"C={cur['max_concurrency']}, {gain:+.0%}) while median E2E latency rises; "
                                f"likely cause: {why}")}
    last = pts[-1]
    return {"knee_concurrency": None, "plateau_concurrency": None, "cause": None,
            "summary": (f"throughput still rising at the largest concurrency tested (C={last['max_concurrency']}, "
                        f"{last['output_throughput']:.1f} tok/s); extend the sweep")}


def _cause(p: dict) -> tuple[str, str]:
    kv = p.get("server_kv_cache_usage_max")
    waiting = p.get("server_requests_waiting_max")
    if kv is not None and kv >= 0.95:
        return "kv_room", f"KV cache {kv:.0%} full: the KV room limits concurrent requests"
    if waiting:
        return "scheduler", (f"up to {waiting:.0f} requests waiting: the scheduler's limit "
                             "(max_num_seqs / batched tokens) or KV admission")
    return "compute", "no requests waiting and KV room left: compute or interconnect bound"


def headline_text(result: dict) -> str:
    """One line for people: the headline figures, the knee, and which points are invalid and why. A figure
    whose point is invalid is said to be unmeasured, never printed as 0."""
    h, points = result["headline"], result["points"]
    invalid = [p for p in points if not p.get("valid", True)]

    def fig(v):
        return "not measured" if v is None else f"{v:.1f} tok/s"

    single = fig(h.get("single_stream_output_tok_s"))
    peak = fig(h.get("peak_output_tok_s"))
    if h.get("peak_concurrency") is not None:
        peak += f" at C={h['peak_concurrency']}"
    text = f"single stream {single}, peak {peak}; {result['knee']['summary']}"
    if invalid:
        why = "; ".join(f"C={p['max_concurrency']}: {', '.join(p.get('invalid_reasons') or ['invalid'])}"
                        for p in invalid)
        text += f"; invalid points (not counted): {why}"
    return text


def headline(points: list[dict]) -> dict:
    """The two figures users quote: single-stream output tok/s and the peak output tok/s of the sweep."""
    valid = [p for p in points if p.get("valid", True)]
    single = [p for p in valid if p["max_concurrency"] == 1]
    peak = max(valid, key=lambda p: p["output_throughput"]) if valid else None
    return {"single_stream_output_tok_s": single[0]["output_throughput"] if single else None,
            "peak_output_tok_s": peak["output_throughput"] if peak else None,
            "peak_concurrency": peak["max_concurrency"] if peak else None,
            # the peak's error bars over repeated runs (no interval from one run: no difference may be claimed)
            "peak_output_tok_s_ci": peak.get("ci_output_throughput") if peak else None}


def baseline_gate(current: dict, baseline: dict, tolerance: float) -> dict:
    """Compare headline figures with a stored baseline; a figure more than `tolerance` below fails."""
    if not 0 <= tolerance < 1:
        raise BenchError(f"baseline tolerance must be in [0, 1), got {tolerance}")
    failures, checked = [], {}
    for key in ("single_stream_output_tok_s", "peak_output_tok_s"):
        base, cur = baseline.get(key), current.get(key)
        if base is None:
            continue
        if cur is None:
            failures.append(f"{key}: baseline {base:.1f}, this run has no valid value")
            continue
        floor = base * (1 - tolerance)
        checked[key] = {"baseline": base, "current": cur, "floor": floor}
        if cur < floor:
            failures.append(f"{key}: {cur:.1f} < {floor:.1f} (baseline {base:.1f} - {tolerance:.0%})")
    if not checked and not failures:
        raise BenchError("the baseline has neither single_stream_output_tok_s nor peak_output_tok_s")
    return {"passed": not failures, "failures": failures, "checked": checked}


def by_turn(records: list[dict]) -> list[dict]:
    """A multi-turn point's requests by turn (records carry `turn`, 1-based): how many were sent and failed, the
    server's mean prompt tokens (the conversation grows turn by turn) and the median TTFT of those answered."""
    out = []
    for k in sorted({r["turn"] for r in records if "turn" in r}):
        rs = [r for r in records if r.get("turn") == k]
        ok = [r for r in rs if not r.get("error")]
        ttfts = [request_timings(r)["ttft"] * 1000 for r in ok]
        out.append({"turn": k, "sent": len(rs), "failed": len(rs) - len(ok),
                    "mean_prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in ok) / len(ok) if ok else None,
                    "median_ttft_ms": percentile(ttfts, 50) if ttfts else None})
    return out


def equivalent_commands(cfg: dict, point: dict, tokenizer: str | None = None) -> dict:
    """The same point as `vllm bench serve`, GuideLLM and AIPerf command lines, so that a reader can re-run it with
    their own tool: same endpoint, model, input and output lengths, ignore_eos, request count, and concurrency (or
    Poisson rate capped by the concurrency). The prompts are each tool's own synthetic ones of the same token
    lengths, not these; the API key is read from the environment, never written here."""
    import shlex

    url, model = cfg["base_url"].rstrip("/"), cfg["model"]
    chat = cfg.get("endpoint") == "chat"
    n, c = int(point["num_prompts"]), point.get("max_concurrency")
    rate = point.get("request_rate")
    rate = None if rate in (None, "inf", float("inf")) else float(rate)
    tok = tokenizer or model
    ilen, olen = int(cfg["input_len"]), int(cfg["output_len"])
    shared = min(int(cfg.get("prefix_len") or ilen // 2), ilen) \
        if cfg.get("workload") in ("shared-prefix", "multi-turn") else 0
    # multi-turn: n sessions of `turns` requests; only AIPerf has synthetic conversations of its own
    turns = int(cfg.get("turns") or 3) if cfg.get("workload") == "multi-turn" else 0
    vllm = ["vllm", "bench", "serve", "--backend", "openai-chat" if chat else "vllm", "--base-url", url,
            "--endpoint", "/v1/chat/completions" if chat else "/v1/completions", "--model", model, "--tokenizer", tok,
            "--dataset-name", "random", "--random-input-len", str(ilen - shared), "--random-output-len", str(olen),
            *(["--random-prefix-len", str(shared)] if shared else []),
            "--num-prompts", str(n), "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,90,99", "--seed", str(cfg.get("seed", 0))]
    if c:
        vllm += ["--max-concurrency", str(c)]
    vllm += ["--request-rate", "inf" if rate is None else f"{rate:g}"]
    goodput = [f"{k}:{cfg[f'goodput_{k}_ms']:g}" for k in ("ttft", "tpot") if cfg.get(f"goodput_{k}_ms")]
    if goodput:
        vllm += ["--goodput", *goodput]
    budget = cfg.get("thinking_budget")
    if budget is not None:
        vllm += ["--extra-body", f'{{"thinking_token_budget": {int(budget)}}}']
    data = f"prompt_tokens={ilen - shared},output_tokens={olen}" + (f",prefix_tokens={shared}" if shared else "")
    guide = ["guidellm", "benchmark", "--target", url, "--model", model, "--processor", tok, "--data", data,
             "--max-requests", str(n)]
    guide += (["--rate-type", "poisson", "--rate", f"{rate:g}"] if rate is not None
              else ["--rate-type", "concurrent", "--rate", str(c or 1)])
    aiperf = ["aiperf", "profile", "--model", model, "--tokenizer", tok, "--url", url, "--endpoint-type",
              "chat" if chat else "completions", "--streaming", "--synthetic-input-tokens-mean", str(ilen - shared),
              *(["--num-prefix-prompts", "1", "--prefix-prompt-length", str(shared)] if shared else []),
              "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(olen), "--output-tokens-stddev",
              "0", "--extra-inputs", "ignore_eos:true",
              *(["--conversation-num", str(n), "--conversation-turn-mean", str(turns), "--conversation-turn-stddev",
                 "0"] if turns else ["--request-count", str(n)]), "--random-seed", str(cfg.get("seed", 0))]
    if budget is not None:
        aiperf += ["--extra-inputs", f"thinking_token_budget:{int(budget)}"]
    if rate is not None:
        aiperf += ["--request-rate", f"{rate:g}"]
    if c:
        aiperf += ["--concurrency", str(c)]
    key = " (the API key: OPENAI_API_KEY in the environment; AIPerf: --api-key \"$OPENAI_API_KEY\")" \
        if cfg.get("api_key") else ""
    note = "each tool's own synthetic prompts of the same token lengths" + (
        f", {shared} of them one prefix shared by every prompt (the prefix options differ between the tools' "
        "versions: check yours)" if shared else "") + (
        f"; multi-turn ({n} sessions of {turns} turns, each turn sent with the conversation so far): AIPerf's "
        "conversations are the equivalent; the vllm bench serve and GuideLLM lines send single-turn prompts of the "
        "first turn's shape (no synthetic conversations there)" if turns else "") + (
        f"; thinking budget {budget} tokens per request (vLLM's thinking_token_budget): the vllm bench serve and "
        "AIPerf lines send it; the GuideLLM line does not" if budget is not None else "") + key
    return {"vllm_bench_serve": shlex.join(vllm), "guidellm": shlex.join(guide), "aiperf": shlex.join(aiperf),
            "note": note}


# --------------------------------------------------------------------------- error bars (issue 26)
def merge_repeats(runs: list[dict]) -> dict:
    """One point from repeated runs of it: the first run's figures, the throughputs replaced by their mean over the
    runs with its interval (ci_output_throughput, ci_request_throughput), each run's headline figures in `runs`, and
    valid only when every run was."""
    p = dict(runs[0])
    for key in ("output_throughput", "request_throughput"):
        ci = mean_ci([r[key] for r in runs])
        p[key], p[f"ci_{key}"] = ci["mean"], ci
    keep = ("output_throughput", "request_throughput", "median_ttft_ms", "median_tpot_ms", "median_e2el_ms", "valid")
    p["runs"] = [{k: r.get(k) for k in keep} for r in runs]
    p["valid"] = all(r.get("valid", True) for r in runs)
    p["invalid_reasons"] = sorted({x for r in runs for x in r.get("invalid_reasons") or []})
    p["failed"] = sum(r.get("failed") or 0 for r in runs)
    return p


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=512)
def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection on t_cdf until the interval cannot shrink; exact to ~1e-10). Kept per
    (p, df): a point's intervals share them, and so do the points of a sweep."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise BenchError(f"t quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    lo, hi = -1e3, 1e3
    for _dummy in range(200):
        mid = (lo + hi) / 2.0
        if mid in (lo, hi):  # no float lies between them
            break
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def mean_ci(values: list[float], confidence: float = 0.95) -> dict:
    """The mean with its Student-t confidence interval and coefficient of variation (sample standard deviation
    / mean); fewer than two values have no interval (half_width None)."""
    xs = [float(v) for v in values if v is not None]
    n = len(xs)
    if not n:
        return {"n": 0, "mean": None, "half_width": None, "low": None, "high": None, "cv": None,
                "confidence": confidence}
    mean = sum(xs) / n
    if n < 2:
        return {"n": 1, "mean": mean, "half_width": None, "low": None, "high": None, "cv": None,
                "confidence": confidence}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "half_width": half, "low": mean - half, "high": mean + half,
            "cv": sd / mean if mean else None, "confidence": confidence}


def differ(a: dict, b: dict) -> bool | None:
    """Whether two confidence intervals say the results differ (they do not overlap); None when either has no
    interval - then no difference may be claimed."""
    if not a or not b or a.get("half_width") is None or b.get("half_width") is None:
        return None
    return a["high"] < b["low"] or b["high"] < a["low"]


# --------------------------------------------------------------------------- capacity under SLOs (issue 26)
SLO_FIELDS = {"ttft_p99_ms": "p99_ttft_ms", "tpot_p99_ms": "p99_tpot_ms", "e2el_p99_ms": "p99_e2el_ms"}
SLO_WORDS = {"ttft_p99_ms": "p99 TTFT", "tpot_p99_ms": "p99 TPOT", "e2el_p99_ms": "p99 E2E"}
# an open-loop probe whose completed requests per second fall this far below the offered rate is over-saturated:
# the server cannot keep up, and every higher rate only queues more
SATURATED_BELOW = 0.9


def check_slo(slo: dict) -> dict:
    """The latency targets, validated: {ttft_p99_ms, tpot_p99_ms, e2el_p99_ms} (at least one), each > 0."""
    if not isinstance(slo, dict) or not slo:
        raise BenchError(f"a capacity search needs at least one latency target ({', '.join(SLO_FIELDS)})")
    bad = [k for k in slo if k not in SLO_FIELDS]
    if bad:
        raise BenchError(f"unknown latency target {bad[0]!r}; the targets are {', '.join(SLO_FIELDS)}")
    for k, v in slo.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v <= 0:
            raise BenchError(f"latency target {k} must be a number of milliseconds > 0, got {v!r}")
    return dict(slo)


def slo_verdict(point: dict, slo: dict, offered_rate: float | None = None) -> tuple[bool, list[str], bool]:
    """(meets, why not, over-saturated) of one probe: every target met by the point's p99, no request failed, the
    point valid (a client-bound point measures the client), and - open loop - the server kept up with the offered
    rate."""
    why = []
    for k, target in slo.items():
        v = point.get(SLO_FIELDS[k])
        if v is None or v > target:
            why.append(f"{SLO_WORDS[k]} {'-' if v is None else f'{v:.1f}'} ms > {target:g} ms")
    if point.get("failed"):
        why.append(f"{point['failed']} requests failed")
    if not point.get("valid", True):
        why.append("invalid point: " + "; ".join(point.get("invalid_reasons") or []))
    saturated = bool(offered_rate) and point.get("request_throughput", 0.0) < SATURATED_BELOW * offered_rate
    if saturated:
        why.append(f"over-saturated: {point.get('request_throughput', 0.0):.2f} req/s completed of {offered_rate:g} "
                   "offered")
    return not why, why, saturated


def next_probe(history: list[tuple[float, bool]], *, start: float, maximum: float, integer: bool,
               precision: float = 0.1, max_probes: int = 12) -> float | None:
    """The next load to try (a rate or a concurrency), or None when the search is done: doubling from `start` until
    a probe misses the targets (or `maximum` is reached), then halving the gap between the highest load that met
    them and the lowest that did not, until that gap is within `precision` of the passing load (integers: 1)."""
    if len(history) >= max_probes:
        return None
    if not history:
        return int(start) if integer else start
    ok = [v for v, meets in history if meets]
    lo = max(ok) if ok else None
    above = [v for v, meets in history if not meets and (lo is None or v > lo)]
    hi = min(above) if above else None
    if hi is None:  # everything so far met the targets: go up
        nxt = min(lo * 2, maximum)
        return None if nxt <= lo else (int(nxt) if integer else nxt)
    if lo is None:  # even the first missed: go down
        nxt = hi / 2
        if integer:
            nxt = int(nxt)
        return None if nxt < (1 if integer else start / 64) or nxt >= hi else nxt
    if integer:
        return None if hi - lo <= 1 else (lo + hi) // 2
    return None if (hi - lo) <= precision * lo else (lo + hi) / 2


def capacity_summary(probes: list[dict], slo: dict, mode: str) -> dict:
    """The capacity found by a search: the highest load that met every target, the lowest above it that did not,
    and a sentence to quote. probes: [{load, meets, why, point}] in the order run."""
    ok = [p for p in probes if p["meets"]]
    best = max(ok, key=lambda p: p["load"]) if ok else None
    above = [p for p in probes if not p["meets"] and (best is None or p["load"] > best["load"])]
    nxt = min(above, key=lambda p: p["load"]) if above else None
    targets = ", ".join(f"{SLO_WORDS[k]} <= {v:g} ms" for k, v in slo.items())
    unit = "req/s" if mode == "rate" else "concurrent"
    if best is None:
        text = f"capacity: none - even {probes[0]['load']:g} {unit} misses {targets} ({'; '.join(probes[0]['why'])})" \
            if probes else "capacity: not searched"
    else:
        pt = best["point"]
        in_flight = pt.get("request_throughput", 0.0) * pt.get("mean_e2el_ms", 0.0) / 1000  # Little's law
        ci = pt.get("ci_request_throughput") or {}
        err = f" ± {ci['half_width']:.2f}" if ci.get("half_width") is not None else ""
        load = (f"{pt.get('request_throughput', 0.0):.2f}{err} req/s at an offered {best['load']:g} req/s "
                f"(~{in_flight:.1f} concurrent)" if mode == "rate" else
                f"{pt.get('request_throughput', 0.0):.2f}{err} req/s at {best['load']:g} concurrent")
        good = pt.get("request_goodput")
        text = f"capacity: {load} at {targets}" + (f"; goodput {good:.2f} req/s" if good is not None else "")
        if nxt is not None:
            text += f"; {nxt['load']:g} {unit} does not meet them ({'; '.join(nxt['why'])})"
        else:
            text += "; the search's maximum still met them (raise it to find the limit)"
    return {"mode": mode, "slo": slo, "capacity": best["load"] if best else None,
            "next": nxt["load"] if nxt else None, "text": text,
            "probes": [{"load": p["load"], "meets": p["meets"], "why": p["why"]} for p in probes]}
