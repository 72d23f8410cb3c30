"""Workload shapes the shared test server (a 1,024-token model that does not reason) cannot serve, through the
benchmark client against a real vLLM (CPU) server of their own: the tiny model built as a reasoning model (<think>
and </think> tokens, a chat template that opens the reasoning, as DeepSeek-R1's and Kimi-K2's do) that declares
16k positions, served with the reasoning flags modelfleet derives from a profile (reasoning_parser deepseek_r1, and
--reasoning-config in extra_args so that requests may carry vLLM's thinking_token_budget) and a 9,216-token limit.
- Reasoning streams: the client counts the reasoning deltas as generation steps and apart from the answer, times
  the answer's first token (TTFA), and its tokens match the server's counter exactly.
- The long-context shape (8k in / 1k out): every prompt is exactly 8,192 tokens and every answer 1,024 by the
  server's own count, and the tokens reconcile."""

from __future__ import annotations

import json

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench_client, vllm_unit

from modelfleet.harness.servers import start_vllm
from modelfleet.harness.tiny_model import build

pytestmark = pytest.mark.integration

# what a profile of a reasoning model gives for this (docs/benchmark.md)
REASONING = {"reasoning_parser": "deepseek_r1",
             "extra_args": ["--reasoning-config",
                            json.dumps({"reasoning_start_str": "<think>", "reasoning_end_str": "</think>"})]}
N = 6
LONG = 8192 + 1024


@pytest.fixture(scope="module")
def reasoner(tmp_path_factory):
    model = tmp_path_factory.mktemp("reasoner") / "tiny-reasoner"
    build(model, seed=0, shards=1, name="tiny-reasoner", reasoning=True, max_positions=16384)
    argv = vllm_unit.server_argv(python="python3", model_dir=str(model), plan=None, host="127.0.0.1", port=8000,
                                 revision=None, profile={"served_model_name": "tiny-reasoner",
                                                         "vllm": {"max_model_len": LONG, **REASONING}})
    # its cold start: 71 s alone here, 498 s in a CI run beside molecule/fleet's three servers
    srv = start_vllm(model, "tiny-reasoner", tmp_path_factory.mktemp("reasoner-logs"), max_model_len=LONG,
                     extra_args=argv[argv.index("--reasoning-parser"):], timeout=1500)
    srv.extra["vocab_size"] = json.loads((model / "config.json").read_text())["vocab_size"]
    try:
        yield srv
    finally:
        srv.stop()


def _point(url, **kw):
    cfg = dict(bench_client.default_config(), base_url=url, model="tiny-reasoner", endpoint="chat", input_len=16,
               output_len=24, warmup=1, **kw)
    p = bench_client.run_point(cfg, concurrency=2, num_prompts=N)
    assert p["failed"] == 0 and p["completed"] == N, p["errors"]
    # every token the server generated is in the client's count (reasoning ones too)
    assert p["reconciled"] is True and p["reconcile_diff"] == 0, p["reconcile_note"]
    return p


def test_reasoning_steps_are_counted_apart_from_the_answer_and_the_answer_is_timed(reasoner):
    seen = []
    for _attempt in range(3):
        short, long = _point(reasoner.url, thinking_budget=4), _point(reasoner.url, thinking_budget=12)
        for p, budget in ((short, 4), (long, 12)):
            r = p["reasoning"]
            assert r["requests"] == r["answered"] == N and r["answer_steps"] > 0
            assert p["p99_ttfa_ms"] >= p["median_ttfa_ms"] >= p["median_ttft_ms"] > 0
            # never more reasoning steps than the budget allows (the template's newline after <think> is one of
            # its tokens, so alone a request reasons budget - 1 steps: one over is allowed, as once seen under load)
            assert N <= r["reasoning_steps"] <= budget * N
        seen.append((short["reasoning"]["reasoning_steps"], long["reasoning"]["reasoning_steps"]))
        # the budget decides the reasoning, token for token: 8 more tokens of budget, 8 more reasoning steps each.
        # Exact only when the server sends one token per step: under load vLLM merges the steps a slow API process
        # has not sent yet into one delta (RequestOutputCollector), and a CI run beside molecule/fleet once saw one
        # step more than the budget gives alone (2026-12-06: 19 and 66 reasoning steps, not 18 and 66). The client
        # counts what was sent; a miscount (the answer's steps counted as reasoning, a step counted twice) is
        # wrong in every attempt.
        if seen[-1][1] - seen[-1][0] == 8 * N:
            # one token per step: the answer's first token comes after the reasoning's (the medians too)
            assert short["median_ttfa_ms"] > short["median_ttft_ms"] and long["median_ttfa_ms"] > long["median_ttft_ms"]
            break
    else:
        pytest.fail(f"a 12-token budget never gave exactly 8 more reasoning steps per request than a 4-token one "
                    f"in 3 attempts (reasoning steps, budget 4 and 12, {N} requests each: {seen})")
    # without a budget the random model never ends its reasoning: every step is reasoning, no answer begins
    unbounded = _point(reasoner.url)
    assert unbounded["reasoning"]["answered"] == 0 and unbounded["reasoning"]["reasoning_share"] == 1.0
    assert "mean_ttfa_ms" not in unbounded
    print(f"\nreasoning streams (tiny model, vLLM CPU): budget 4 -> {short['reasoning']['reasoning_steps'] / N:.0f} "
          f"reasoning steps per request, TTFT p50 {short['median_ttft_ms']:.0f} ms, TTFA p50 "
          f"{short['median_ttfa_ms']:.0f} ms; budget 12 -> {long['reasoning']['reasoning_steps'] / N:.0f}, TTFA p50 "
          f"{long['median_ttfa_ms']:.0f} ms; the server's own reasoning_tokens: "
          f"{short['reasoning']['server_reasoning_tokens']}")


def test_the_long_context_shape_sends_8k_tokens_and_gets_1k_by_the_servers_count(reasoner):
    cfg = dict(bench_client.default_config(), base_url=reasoner.url, model="tiny-reasoner", endpoint="completions",
               input_len=8192, output_len=1024, vocab_size=reasoner.extra["vocab_size"], warmup=0)
    p = bench_client.run_point(cfg, concurrency=2, num_prompts=2)
    assert p["failed"] == 0 and p["completed"] == 2, p["errors"]
    assert p["input_lens"] == [8192, 8192] and p["output_lens"] == [1024, 1024]  # the server's usage, per request
    assert p["reconciled"] is True and p["reconcile_diff"] == 0, p["reconcile_note"]
    print(f"\nlong context (8,192 in / 1,024 out, tiny model, vLLM CPU, C=2): TTFT p50 {p['median_ttft_ms']:.0f} ms, "
          f"TPOT p50 {p['median_tpot_ms']:.1f} ms, {p['output_throughput']:.0f} out tok/s")
