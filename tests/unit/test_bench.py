"""Benchmark arithmetic: metrics formulas, Prometheus parsing, reconciliation, client health, knee, gate."""

from __future__ import annotations

import json

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.bench import BenchError


def rec(start, ttft, gaps, n=None, prompt=10, error=""):
    chunks = [start + ttft]
    for g in gaps:
        chunks.append(chunks[-1] + g)
    return {"start": start, "end": chunks[-1], "chunk_times": chunks, "prompt_tokens": prompt,
            "completion_tokens": len(chunks) if n is None else n, "error": error}


def test_percentile_matches_linear_interpolation():
    assert bench.percentile([], 50) == 0.0
    assert bench.percentile([5], 99) == 5
    assert bench.percentile([1, 2, 3, 4], 50) == 2.5
    assert bench.percentile(list(range(101)), 90) == 90
    assert bench.percentile([10, 0], 25) == 2.5


def test_point_metrics_formulas():
    # two requests: ttft 0.1 s, then 4 gaps of 0.05 s -> 5 tokens, e2el 0.3 s, tpot 0.05 s
    recs = [rec(0.0, 0.1, [0.05] * 4), rec(0.1, 0.2, [0.05] * 4)]
    m = bench.point_metrics(recs)
    assert m["completed"] == 2 and m["failed"] == 0
    assert m["duration"] == pytest.approx(0.5)  # 0.0 -> 0.1 + 0.2 + 0.2
    assert m["total_output_tokens"] == 10 and m["total_input_tokens"] == 20
    assert m["output_throughput"] == pytest.approx(10 / 0.5)
    assert m["total_token_throughput"] == pytest.approx(30 / 0.5)
    assert m["request_throughput"] == pytest.approx(4.0)
    assert m["mean_ttft_ms"] == pytest.approx(150)
    assert m["median_ttft_ms"] == pytest.approx(150)
    assert m["mean_tpot_ms"] == pytest.approx(50)
    assert m["mean_itl_ms"] == pytest.approx(50) and m["std_itl_ms"] == pytest.approx(0, abs=1e-9)
    assert m["mean_e2el_ms"] == pytest.approx(350)
    assert m["p99_e2el_ms"] == pytest.approx(300 + 100 * 0.99)
    assert m["output_tokens_per_user_s"] == pytest.approx(20)
    assert m["request_goodput"] is None


def test_tpot_uses_server_count_not_chunks():
    # one chunk carried 3 tokens: server says n=7 over 5 chunks; tpot = (e2el - ttft) / (n - 1)
    m = bench.point_metrics([rec(0.0, 0.1, [0.06] * 4, n=7)])
    assert m["mean_tpot_ms"] == pytest.approx(240 / 6)
    assert m["mean_itl_ms"] == pytest.approx(60)


def test_goodput_counts_requests_within_limits():
    recs = [rec(0, 0.05, [0.01] * 3), rec(0, 0.5, [0.01] * 3), rec(0, 0.05, [0.2] * 3)]
    m = bench.point_metrics(recs, goodput_ttft_ms=100, goodput_tpot_ms=50)
    assert m["request_goodput"] == pytest.approx(1 / m["duration"])


def test_failed_requests_are_counted_not_timed():
    recs = [rec(0, 0.1, [0.05]), {"start": 0, "end": 1.0, "chunk_times": [], "prompt_tokens": 0,
                                  "completion_tokens": 0, "error": "HTTP 500: boom"}]
    m = bench.point_metrics(recs)
    assert m["completed"] == 1 and m["failed"] == 1 and m["errors"] == ["HTTP 500: boom"]
    assert m["mean_ttft_ms"] == pytest.approx(100)


def test_empty_point_is_an_error():
    with pytest.raises(BenchError, match="num_prompts"):
        bench.point_metrics([])


PROM = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 1234.0
vllm:generation_tokens_total{engine="1",model_name="tiny"} 6.0
vllm:generation_tokens_total{engine="0",model_name="other"} 999.0
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 50
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="0",model_name="tiny"} 8.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.42
vllm:cache_config_info{block_size="16",num_gpu_blocks="1000",engine="0"} 1.0
process_cpu_seconds_total 12.5
"""


def test_parse_prometheus_and_snapshot():
    s = bench.parse_prometheus(PROM)
    assert ("process_cpu_seconds_total", {}, 12.5) in s
    snap = bench.server_snapshot(PROM, "tiny")
    assert snap["generation_tokens_total"] == 1240.0
    assert snap["prompt_tokens_total"] == 50
    assert snap["requests_waiting"] == 3 and snap["requests_running"] == 8
    assert snap["kv_cache_usage"] == pytest.approx(0.42)
    assert snap["kv_tokens_capacity"] == 16000
    assert bench.server_snapshot(PROM)["generation_tokens_total"] == 2239.0
    assert bench.server_snapshot("", "tiny")["generation_tokens_total"] is None


def test_a_server_asked_by_an_alias_is_read_by_its_one_model_label():
    """vLLM labels its metrics with the first name it serves; a client of a fleet endpoint names the endpoint's
    model (an alias). One server's one label is then its model's; among several, none is guessed."""
    one = "\n".join(line for line in PROM.splitlines() if 'model_name="other"' not in line)
    assert bench.server_snapshot(one, "llama")["generation_tokens_total"] == 1240.0
    assert bench.server_snapshot(one, "llama")["requests_running"] == 8
    assert bench.server_snapshot(PROM, "llama")["generation_tokens_total"] is None
    assert bench.server_snapshot(PROM, "other")["generation_tokens_total"] == 999.0


def test_reconcile_within_and_beyond_tolerance():
    b, a = {"generation_tokens_total": 100.0}, {"generation_tokens_total": 1100.0}
    assert bench.reconcile(1000, b, a)["reconciled"] is True
    assert bench.reconcile(1015, b, a)["reconcile_diff"] == pytest.approx(0.015)
    r = bench.reconcile(900, b, a)
    assert r["reconciled"] is False and "10.0% apart" in r["reconcile_note"]
    assert bench.reconcile(10, {}, {})["reconciled"] is None


def test_client_health_flags_cpu_and_lag():
    ok = bench.client_health([0.3, 0.5], [0.1] * 200)
    assert not ok["client_bound"] and ok["client_cpu_fraction_max"] == 0.5
    cpu = bench.client_health([0.95], [0.1] * 10)
    assert cpu["client_bound"] and "95% of a core" in cpu["client_reasons"][0]
    lag = bench.client_health([0.2], [1.0] * 90 + [80.0] * 10)
    assert lag["client_bound"] and "lag p99" in lag["client_reasons"][0]


def test_sweep_levels_and_prompt_scaling():
    assert bench.sweep_levels(16) == [1, 2, 4, 8, 16]
    assert bench.sweep_levels(12) == [1, 2, 4, 8, 12]
    assert bench.sweep_levels(1) == [1]
    assert bench.sweep_levels(0, [4, 1, 4]) == [1, 4]
    with pytest.raises(BenchError, match="positive integer"):
        bench.sweep_levels(0)
    with pytest.raises(BenchError, match=r"\[0\]"):
        bench.sweep_levels(4, [0])
    assert bench.num_prompts_for(1) == 8 and bench.num_prompts_for(16) == 64
    assert bench.num_prompts_for(1000, maximum=2000) == 2000
    assert bench.kv_bound(16000, 100, 100) == 80 and bench.kv_bound(None, 1, 1) is None


def pt(c, thr, e2e, waiting=0, kv=0.1, valid=True):
    return {"max_concurrency": c, "output_throughput": thr, "median_e2el_ms": e2e,
            "server_requests_waiting_max": waiting, "server_kv_cache_usage_max": kv, "valid": valid}


def test_knee_found_with_cause():
    pts = [pt(1, 80, 100), pt(2, 150, 105), pt(4, 280, 110), pt(8, 300, 200, waiting=4), pt(16, 305, 400)]
    k = bench.find_knee(pts)
    assert k["knee_concurrency"] == 4 and k["plateau_concurrency"] == 8
    assert k["cause"] == "scheduler" and "C=4" in k["summary"]
    kv = bench.find_knee([pt(1, 80, 100), pt(2, 85, 180, kv=0.99)])
    assert kv["cause"] == "kv_room"
    comp = bench.find_knee([pt(1, 80, 100), pt(2, 82, 190)])
    assert comp["cause"] == "compute"


def test_knee_ignores_invalid_points_and_reports_no_knee():
    pts = [pt(1, 80, 100), pt(2, 81, 300, valid=False), pt(4, 300, 110)]
    k = bench.find_knee(pts)
    assert k["knee_concurrency"] is None and "still rising" in k["summary"]
    assert bench.find_knee([pt(1, 1, 1)])["summary"].startswith("fewer than two")


def test_headline_and_baseline_gate():
    pts = [pt(1, 82, 100), pt(8, 2276, 300), pt(16, 2000, 900, valid=False)]
    h = bench.headline(pts)
    assert h == {"single_stream_output_tok_s": 82, "peak_output_tok_s": 2276, "peak_concurrency": 8,
                 "peak_output_tok_s_ci": None}
    assert bench.baseline_gate(h, {"single_stream_output_tok_s": 80, "peak_output_tok_s": 2300}, 0.05)["passed"]
    g = bench.baseline_gate(h, {"peak_output_tok_s": 2600}, 0.10)
    assert not g["passed"] and "2276.0 < 2340.0" in g["failures"][0]
    with pytest.raises(BenchError, match="tolerance"):
        bench.baseline_gate(h, {"peak_output_tok_s": 1}, 1.5)
    with pytest.raises(BenchError, match="neither"):
        bench.baseline_gate(h, {"other": 1}, 0.1)


def test_headline_text_never_prints_an_invalid_point_as_a_figure():
    bad = dict(pt(1, 500, 100, valid=False), invalid_reasons=["client CPU 97% busy: the client, not the server"])
    pts = [bad, pt(2, 478.3, 300)]
    result = {"points": pts, "headline": bench.headline(pts), "knee": bench.find_knee(pts)}
    text = bench.headline_text(result)
    assert text.startswith("single stream not measured, peak 478.3 tok/s at C=2;")
    assert "invalid points (not counted): C=1: client CPU 97% busy" in text and "0.0" not in text
    ok = [pt(1, 82, 100), pt(8, 2276, 300)]
    text = bench.headline_text({"points": ok, "headline": bench.headline(ok), "knee": bench.find_knee(ok)})
    assert text.startswith("single stream 82.0 tok/s, peak 2276.0 tok/s at C=8;") and "invalid" not in text
    none = [dict(pt(1, 5, 100, valid=False), invalid_reasons=[])]
    text = bench.headline_text({"points": none, "headline": bench.headline(none), "knee": bench.find_knee(none)})
    assert text.startswith("single stream not measured, peak not measured;") and "C=1: invalid" in text


def test_equivalent_commands_repeat_the_point_with_other_tools():
    import shlex

    cfg = {"base_url": "http://10.0.0.5:8000/", "model": "kimi", "endpoint": "completions", "input_len": 1024,
           "output_len": 256, "seed": 3, "api_key": "sk-secret", "goodput_ttft_ms": 500, "goodput_tpot_ms": None}
    closed = bench.equivalent_commands(cfg, {"num_prompts": 64, "max_concurrency": 16, "request_rate": "inf"},
                                       tokenizer="moonshotai/Kimi-K2.5")
    v = shlex.split(closed["vllm_bench_serve"])
    assert v[:3] == ["vllm", "bench", "serve"] and "--ignore-eos" in v
    for flag, want in (("--base-url", "http://10.0.0.5:8000"), ("--random-input-len", "1024"),
                       ("--random-output-len", "256"), ("--num-prompts", "64"), ("--max-concurrency", "16"),
                       ("--request-rate", "inf"), ("--tokenizer", "moonshotai/Kimi-K2.5"), ("--goodput", "ttft:500")):
        assert v[v.index(flag) + 1] == want, flag
    g = shlex.split(closed["guidellm"])
    assert g[g.index("--rate-type") + 1:g.index("--rate-type") + 4] == ["concurrent", "--rate", "16"]
    assert "prompt_tokens=1024,output_tokens=256" in g and g[g.index("--max-requests") + 1] == "64"
    a = shlex.split(closed["aiperf"])
    assert a[a.index("--concurrency") + 1] == "16" and "--request-rate" not in a and "ignore_eos:true" in a
    assert all("sk-secret" not in x for x in closed.values()) and "OPENAI_API_KEY" in closed["note"]
    opened = bench.equivalent_commands(dict(cfg, endpoint="chat", api_key=""),
                                       {"num_prompts": 200, "max_concurrency": 32, "request_rate": 4.5})
    v, g, a = (shlex.split(opened[k]) for k in ("vllm_bench_serve", "guidellm", "aiperf"))
    assert v[v.index("--request-rate") + 1] == "4.5" and v[v.index("--max-concurrency") + 1] == "32"
    assert v[v.index("--endpoint") + 1] == "/v1/chat/completions" and v[v.index("--tokenizer") + 1] == "kimi"
    assert g[g.index("--rate-type") + 1:g.index("--rate-type") + 4] == ["poisson", "--rate", "4.5"]
    assert a[a.index("--request-rate") + 1] == "4.5" and a[a.index("--endpoint-type") + 1] == "chat"
    assert "OPENAI_API_KEY" not in opened["note"]
    thinking = bench.equivalent_commands(dict(cfg, endpoint="chat", thinking_budget=64),
                                         {"num_prompts": 8, "max_concurrency": 1, "request_rate": "inf"})
    v, a = shlex.split(thinking["vllm_bench_serve"]), shlex.split(thinking["aiperf"])
    assert json.loads(v[v.index("--extra-body") + 1]) == {"thinking_token_budget": 64}
    assert "thinking_token_budget:64" in a and "GuideLLM line does not" in thinking["note"]
    assert "--extra-body" not in shlex.split(opened["vllm_bench_serve"])


@pytest.mark.parametrize("df,want", [(1, 12.7062), (4, 2.7764), (9, 2.2622), (29, 2.0452), (1000, 1.9623)])
def test_student_t_quantiles_match_the_tables(df, want):
    assert bench.t_quantile(0.975, df) == pytest.approx(want, abs=1e-4)
    assert bench.t_cdf(want, df) == pytest.approx(0.975, abs=1e-5) and bench.t_cdf(0.0, df) == pytest.approx(0.5)


def test_mean_ci_and_when_two_results_differ():
    ci = bench.mean_ci([10.0, 12.0, 11.0, 13.0, 9.0])  # mean 11, sd 1.5811, t(0.975, 4) = 2.7764
    assert ci["mean"] == pytest.approx(11.0) and ci["half_width"] == pytest.approx(2.7764 * 1.5811 / 5 ** 0.5, 1e-3)
    assert ci["cv"] == pytest.approx(1.5811 / 11, 1e-3) and ci["n"] == 5
    assert bench.mean_ci([5.0])["half_width"] is None and bench.mean_ci([])["mean"] is None
    near = bench.mean_ci([11.5, 12.5, 12.0, 13.0, 11.0])
    far = bench.mean_ci([20.0, 21.0, 19.5, 20.5, 21.5])
    assert bench.differ(ci, near) is False and bench.differ(ci, far) is True
    assert bench.differ(ci, bench.mean_ci([30.0])) is None  # one run: no claim either way
    with pytest.raises(BenchError, match="0 < p < 1"):
        bench.t_quantile(1.0, 3)


def test_repeated_runs_of_a_point_give_its_throughput_with_error_bars():
    def run(tput, valid=True):
        return {"output_throughput": tput, "request_throughput": tput / 100, "median_ttft_ms": 10.0,
                "median_tpot_ms": 5.0, "median_e2el_ms": 100.0, "valid": valid, "failed": 0,
                "invalid_reasons": [] if valid else ["client-bound"], "max_concurrency": 8}

    p = bench.merge_repeats([run(1000.0), run(1100.0), run(900.0)])
    assert p["output_throughput"] == pytest.approx(1000.0) and p["ci_output_throughput"]["n"] == 3
    assert p["ci_output_throughput"]["half_width"] == pytest.approx(bench.t_quantile(0.975, 2) * 100 / 3 ** 0.5)
    assert [r["output_throughput"] for r in p["runs"]] == [1000.0, 1100.0, 900.0] and p["valid"]
    bad = bench.merge_repeats([run(1000.0), run(1000.0, valid=False)])
    assert bad["valid"] is False and bad["invalid_reasons"] == ["client-bound"]
    one = bench.merge_repeats([run(500.0)])
    assert one["output_throughput"] == 500.0 and one["ci_output_throughput"]["half_width"] is None
    assert bench.headline([dict(p, valid=True)])["peak_output_tok_s_ci"]["n"] == 3


def _search(capacity: float, *, start=1.0, maximum=256.0, integer=False, precision=0.1):
    """Drive next_probe against a server that meets the targets up to `capacity`."""
    history = []
    while (load := bench.next_probe(history, start=start, maximum=maximum, integer=integer,
                                    precision=precision)) is not None:
        history.append((load, load <= capacity))
    return history


def test_the_capacity_search_doubles_then_bisects_to_the_limit():
    h = _search(37.0)
    assert [v for v, _ in h[:7]] == [1, 2, 4, 8, 16, 32, 64]
    ok, bad = max(v for v, m in h if m), min(v for v, m in h if not m)
    assert ok <= 37.0 < bad and bad - ok <= 0.1 * ok
    c = _search(11, integer=True)
    assert [v for v, _ in c] == [1, 2, 4, 8, 16, 12, 10, 11] and all(isinstance(v, int) for v, _ in c)
    assert _search(1000, maximum=100)[-1] == (100, True)  # the maximum still meets: the search stops there
    assert [v for v, _ in _search(0.1)][:3] == [1, 0.5, 0.25]  # even the start misses: it goes down


def test_slo_verdict_names_every_miss_and_an_over_saturated_server():
    p = {"p99_ttft_ms": 250.0, "p99_tpot_ms": 40.0, "failed": 0, "valid": True, "request_throughput": 9.95}
    assert bench.slo_verdict(p, {"ttft_p99_ms": 300, "tpot_p99_ms": 50}, offered_rate=10) == (True, [], False)
    meets, why, sat = bench.slo_verdict(dict(p, p99_ttft_ms=900.0, failed=2, request_throughput=6.0),
                                        {"ttft_p99_ms": 300, "tpot_p99_ms": 50}, offered_rate=10)
    assert not meets and sat and why == ["p99 TTFT 900.0 ms > 300 ms", "2 requests failed",
                                         "over-saturated: 6.00 req/s completed of 10 offered"]
    for bad, needle in (({}, "at least one"), ({"ttft_p50_ms": 3}, "unknown latency target"),
                        ({"ttft_p99_ms": 0}, "> 0"), ({"tpot_p99_ms": float("nan")}, "> 0")):
        with pytest.raises(BenchError, match=needle):
            bench.check_slo(bad)


def test_capacity_summary_quotes_the_limit_and_the_next_step():
    def probe(load, meets, why=()):
        pt = {"request_throughput": load * 0.99, "mean_e2el_ms": 400.0, "request_goodput": load * 0.9,
              "ci_request_throughput": {"half_width": 0.05}}
        return {"load": load, "meets": meets, "why": list(why), "point": pt}

    s = bench.capacity_summary([probe(8, True), probe(16, False, ["p99 TTFT 900.0 ms > 300 ms"]), probe(12, True),
                                probe(14, False, ["p99 TTFT 400.0 ms > 300 ms"])], {"ttft_p99_ms": 300}, "rate")
    assert (s["capacity"], s["next"]) == (12, 14)
    assert s["text"] == ("capacity: 11.88 ± 0.05 req/s at an offered 12 req/s (~4.8 concurrent) at p99 TTFT <= 300 ms; "
                         "goodput 10.80 req/s; 14 req/s does not meet them (p99 TTFT 400.0 ms > 300 ms)")
    none = bench.capacity_summary([probe(1, False, ["p99 TPOT 90.0 ms > 50 ms"])], {"tpot_p99_ms": 50}, "concurrency")
    assert none["capacity"] is None and none["text"].startswith("capacity: none - even 1 concurrent misses")


def test_the_multi_turn_workload_sends_each_turn_with_the_conversation_so_far():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench_client

    cfg = dict(bench_client.default_config(), input_len=40, output_len=6, vocab_size=386, workload="multi-turn",
               prefix_len=30, turns=3)
    a, b = bench_client.make_prompts(cfg, 2, salt=1), bench_client.make_prompts(cfg, 1, salt=2)
    assert len(a) == 2 and all(s["system"] == a[0]["system"] and len(s["system"]) == 30 for s in a + b)
    assert [len(t) for t in a[0]["turns"]] == [10, 10, 10] and [len(r) for r in a[0]["replies"]] == [6, 6]
    assert a[0]["turns"] != a[1]["turns"]
    s = a[0]
    p = [bench_client.turn_prompt(cfg, s, k, []) for k in range(3)]
    assert [len(x) for x in p] == [40, 56, 72]  # system + k user turns + (k - 1) answers of output_len
    assert p[0] == s["system"] + s["turns"][0] and p[1][:40] == p[0] and p[2][:56] == p[1]  # each extends the last
    assert p[2][40:46] == s["replies"][0] and p[2][56:62] == s["replies"][1] and p[2][62:] == s["turns"][2]
    # words on the chat endpoint: the system prompt, then each turn with the answer the server streamed
    chat = dict(cfg, vocab_size=0, endpoint="chat")
    w = bench_client.make_prompts(chat, 1, salt=1)[0]
    assert "replies" not in w and len(w["system"].split()) == 30 and len(w["turns"][1].split()) == 10
    msgs = bench_client.turn_prompt(chat, w, 2, ["first answer", "second answer"])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[2]["content"] == "first answer" and msgs[5]["content"] == w["turns"][2]
    assert bench_client._payload(chat, msgs)["messages"] == msgs
    text = bench_client.turn_prompt(dict(chat, endpoint="completions"), w, 1, ["an answer"])
    assert text == " ".join([w["system"], w["turns"][0], "an answer", w["turns"][1]])
    for bad, words in ((dict(cfg, turns=0), "turns must be a whole number"),
                       (dict(cfg, prefix_len=40), "leaves no token of input_len 40")):
        with pytest.raises(BenchError, match=words):
            bench_client.make_prompts(bad, 1, salt=0)
    # another tool's equivalent: AIPerf's conversations; the others are told to be single-turn
    eq = bench.equivalent_commands(cfg, {"num_prompts": 8, "max_concurrency": 4})
    assert "--conversation-num 8 --conversation-turn-mean 3" in eq["aiperf"] and "--request-count" not in eq["aiperf"]
    assert "multi-turn (8 sessions of 3 turns" in eq["note"] and "--random-prefix-len 30" in eq["vllm_bench_serve"]


def test_a_multi_turn_point_is_summed_up_by_turn():
    def rec(turn, start, first, prompt, error=""):
        return {"turn": turn, "start": start, "sent": start, "end": first + 0.1, "chunk_times": [first, first + 0.1],
                "prompt_tokens": prompt, "completion_tokens": 2, "error": error}

    got = bench.by_turn([rec(1, 0, 0.1, 40), rec(2, 1, 1.3, 56), rec(1, 0, 0.3, 40), rec(2, 1, 1.1, 0, "HTTP 500")])
    assert got == [{"turn": 1, "sent": 2, "failed": 0, "mean_prompt_tokens": 40, "median_ttft_ms": pytest.approx(200)},
                   {"turn": 2, "sent": 2, "failed": 1, "mean_prompt_tokens": 56, "median_ttft_ms": pytest.approx(300)}]
    assert bench.by_turn([{"start": 0, "end": 1}]) == []


def test_the_shared_prefix_workload_starts_every_prompt_alike():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench_client

    cfg = dict(bench_client.default_config(), input_len=40, vocab_size=386, workload="shared-prefix", prefix_len=30)
    a, b = bench_client.make_prompts(cfg, 2, salt=1), bench_client.make_prompts(cfg, 3, salt=2)
    assert all(len(p) == 40 and p[:30] == a[0][:30] for p in a + b)  # one prefix for every point of the run
    assert a[0][30:] != a[1][30:] and all(96 <= t < 386 for p in a for t in p)
    words = bench_client.make_prompts(dict(cfg, vocab_size=0), 2, salt=1)
    assert words[0].split()[:30] == words[1].split()[:30] and len(words[0].split()) == 40
    random_ = bench_client.make_prompts(dict(cfg, workload="random"), 2, salt=1)
    assert random_[0][:30] != random_[1][:30]
    with pytest.raises(BenchError, match="workload must be one of"):
        bench_client.make_prompts(dict(cfg, workload="sharegpt"), 1, salt=0)
    v = bench.equivalent_commands(cfg, {"num_prompts": 8, "max_concurrency": 4})["vllm_bench_serve"]
    assert "--random-prefix-len 30" in v and "--random-input-len 10" in v
    assert bench.prefix_cache({"prefix_cache_queries_total": 100.0, "prefix_cache_hits_total": 10.0},
                              {"prefix_cache_queries_total": 500.0, "prefix_cache_hits_total": 250.0}) == {
        "prefix_cache_queries": 400.0, "prefix_cache_hits": 240.0, "prefix_cache_hit_rate": 0.6}
    assert bench.prefix_cache({}, {})["prefix_cache_hit_rate"] is None


def test_replicas_snapshots_add_up_and_a_missing_counter_is_not_half_counted():
    a = {"generation_tokens_total": 100.0, "requests_running": 2.0, "kv_cache_usage": 0.5, "kv_tokens_capacity": 1000,
         "prefix_cache_hits_total": 4.0}
    b = {"generation_tokens_total": 40.0, "requests_running": 1.0, "kv_cache_usage": 0.7, "kv_tokens_capacity": 1000,
         "prefix_cache_hits_total": None}
    both = bench.combine_snapshots([a, b])
    assert both["generation_tokens_total"] == 140 and both["requests_running"] == 3
    assert both["kv_tokens_capacity"] == 2000 and both["kv_cache_usage"] == 0.7  # the fullest replica
    assert both["prefix_cache_hits_total"] is None  # one replica has no such counter: no partial sum
    assert bench.combine_snapshots([a]) == a
    with pytest.raises(BenchError, match="no server snapshot"):
        bench.combine_snapshots([])
    # reconciled against both replicas: the client's 140 tokens match; against one replica's counter they would not
    assert bench.reconcile(140, {"generation_tokens_total": 0.0}, both)["reconciled"] is True
    assert bench.reconcile(140, {"generation_tokens_total": 0.0}, a)["reconciled"] is False


def _pt(c, tok_s, ttft=100.0, half=None, rate="inf", valid=True):
    p = {"max_concurrency": c, "request_rate": rate, "output_throughput": tok_s, "p99_ttft_ms": ttft,
         "failed": 0, "valid": valid}
    if half is not None:
        p["ci_output_throughput"] = {"half_width": half, "low": tok_s - half, "high": tok_s + half}
    return p


def test_the_endpoint_is_compared_point_by_point_with_the_sum_of_its_replicas_alone():
    alone = {"http://b:8000": {"points": [_pt(1, 40.0, 90), _pt(2, 70.0, 120)]},
             "http://a:8000": {"points": [_pt(1, 60.0, 80), _pt(2, 90.0, 110)]}}
    endpoint = {"points": [_pt(2, 95.0, 130), _pt(4, 176.0, 150, valid=False)]}
    cmp = bench.fleet_comparison(endpoint, alone)
    assert cmp["replicas"] == ["http://a:8000", "http://b:8000"] and cmp["n"] == 2
    first, second = cmp["rows"]
    assert (first["replica_concurrency"], first["endpoint_concurrency"]) == (1, 2)
    assert first["sum_output_tok_s"] == 100.0 and first["ratio"] == pytest.approx(0.95)
    assert first["replicas_p99_ttft_ms_max"] == 90 and first["different"] is None  # no intervals: no claim
    assert second["ratio"] == pytest.approx(176 / 160) and not second["valid"]
    text = cmp["text"]
    assert "C=2 (each replica alone at C=1): 95.0 out tok/s vs 100.0 summed (0.95x)" in text
    assert "INVALID point" in text.splitlines()[2]


def test_with_error_bars_only_intervals_that_do_not_overlap_are_called_different():
    alone = {"r1": {"points": [_pt(1, 50.0, half=3.0)]}, "r2": {"points": [_pt(1, 50.0, half=4.0)]}}
    close = bench.fleet_comparison({"points": [_pt(2, 97.0, half=2.0)]}, alone)["rows"][0]
    assert close["different"] is False  # the sum's half-width is 5 (3 and 4 in quadrature)
    far = bench.fleet_comparison({"points": [_pt(2, 80.0, half=2.0)]}, alone)
    assert far["rows"][0]["different"] is True and "(0.80x, different)" in far["text"]


def test_a_replica_without_every_point_is_refused():
    with pytest.raises(BenchError, match="replica point 2 missing"):
        bench.fleet_comparison({"points": [_pt(2, 1.0), _pt(4, 1.0)]}, {"r1": {"points": [_pt(1, 1.0)]}})
    with pytest.raises(BenchError, match="no replica measured alone"):
        bench.fleet_comparison({"points": [_pt(2, 1.0)]}, {})


def test_a_reasoning_point_tells_the_thinking_apart_and_times_the_answer():
    """TTFT counts the first reasoning token; TTFA (time to the first token of the answer) is what a user of a
    reasoning model waits for. A request still thinking at max_tokens has no answer: it is counted, not timed."""
    a = dict(rec(0.0, 0.1, [0.05] * 9), reasoning_steps=6, answer_at=0.1 + 6 * 0.05, server_reasoning_tokens=0)
    b = dict(rec(0.2, 0.1, [0.05] * 9), reasoning_steps=2, answer_at=0.2 + 0.1 + 2 * 0.05, server_reasoning_tokens=0)
    thinking = dict(rec(0.0, 0.1, [0.05] * 9), reasoning_steps=10, answer_at=None)
    m = bench.point_metrics([a, b, thinking])
    r = m["reasoning"]
    assert (r["requests"], r["answered"], r["reasoning_steps"], r["answer_steps"]) == (3, 2, 18, 12)
    assert r["reasoning_share"] == pytest.approx(18 / 30) and r["server_reasoning_tokens"] == 0
    assert m["mean_ttfa_ms"] == pytest.approx((400 + 200) / 2) and m["p99_ttfa_ms"] == pytest.approx(200 + 200 * 0.99)
    assert m["mean_ttft_ms"] == pytest.approx(100)
    plain = dict(rec(0.0, 0.1, [0.05] * 3), reasoning_steps=0, answer_at=0.1)
    assert "reasoning" not in bench.point_metrics([plain]) and "mean_ttfa_ms" not in bench.point_metrics([plain])


def test_a_thinking_budget_is_a_whole_number_for_the_chat_endpoint():
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench_client

    cfg = dict(bench_client.default_config(), model="m", endpoint="chat", thinking_budget=16)
    bench_client.make_prompts(cfg, 2, 0)
    assert bench_client._payload(cfg, "hi")["thinking_token_budget"] == 16
    assert "thinking_token_budget" not in bench_client._payload(dict(cfg, thinking_budget=None), "hi")
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(BenchError, match="thinking_budget must be a whole number of tokens >= 0"):
            bench_client.make_prompts(dict(cfg, thinking_budget=bad), 2, 0)
    with pytest.raises(BenchError, match="set endpoint to chat"):
        bench_client.make_prompts(dict(cfg, endpoint="completions"), 2, 0)
