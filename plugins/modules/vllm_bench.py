#!/usr/bin/python
"""Ansible module shell over module_utils bench_run.run_benchmark: run a benchmark sweep against a vLLM server and
write the result (JSON) on the host."""

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
  - Needs httptools in the interpreter that runs it (every vLLM venv has it); the role runs it with the vLLM
    venv's python. In check mode nothing is sent and the planned levels are returned.
version_added: "0.1.0"
author: modelfleet developers (@modelfleet)
options:
  endpoint: {description: Which API to stream from., type: str, choices: [completions, chat], default: completions}
  input_len: {description: Prompt tokens per request., type: int, default: 128}
  output_len: {description: Generated tokens per request., type: int, default: 128}
  vocab_size:
    description: >-
      The tokenizer's vocabulary size (len(tokenizer), can be below config.json's vocab_size); when set, completions
      prompts are random token ids (exact input length).
    type: int
    default: 0
  max_concurrency: {description: 'Sweep 1, 2, 4, ... up to this.', type: int, default: 16}
  concurrency_levels: {description: Explicit levels (overrides O(max_concurrency))., type: list, elements: int}
  request_rate: {description: Poisson request rate (req/s); 0 = closed loop., type: float, default: 0}
  per_level: {description: "Prompts per point = clamp(concurrency * per_level, min_prompts, max_prompts).", type: int, default: 4}
  repeat: {description: "Runs of every point; from 2, each point carries its throughputs' Student-t 95% confidence interval.", type: int, default: 1}
  min_prompts: {description: Fewest prompts per point., type: int, default: 8}
  max_prompts: {description: Most prompts per point., type: int, default: 2000}
  warmup: {description: Warm-up requests before each point (not measured)., type: int, default: 2}
  processes: {description: "Client processes per point (0 = one per 256 streams, at most the CPU count).", type: int, default: 0}
  kv_tokens_capacity:
    description: KV tokens the server can hold (the planner's kv_tokens_capacity); 0 = read vllm:cache_config_info.
    type: int
    default: 0
  goodput_ttft_ms: {description: TTFT limit for goodput., type: float}
  goodput_tpot_ms: {description: TPOT limit for goodput., type: float}
  reconcile_tolerance: {description: Largest client/server token difference of a valid point., type: float, default: 0.02}
  workload:
    description:
      - "C(random) prompts, or C(shared-prefix): every prompt starts with the same O(prefix_len) tokens (a shared"
      - "system prompt); the server's prefix-cache hits are recorded per point."
      - "C(multi-turn): sessions of O(turns) requests after that shared system prompt, each sent after the answer to"
      - "the one before with the conversation so far; a point's prompt count is its sessions."
    type: str
    choices: [random, shared-prefix, multi-turn]
    default: random
  prefix_len: {description: "Tokens of the shared prefix (0 = half the input).", type: int, default: 0}
  turns: {description: "Requests per session (multi-turn).", type: int, default: 3}
  thinking_budget:
    description:
      - "A reasoning model's thinking per request, in tokens (vLLM's C(thinking_token_budget); the server needs a"
      - "reasoning parser and reasoning config). Omitted: the model ends its reasoning itself. Chat endpoint only."
    type: int
  max_client_cpu_fraction: {description: A client process above this share of a core makes a point invalid., type: float, default: 0.9}
  max_loop_lag_p99_ms: {description: Client event-loop lag p99 above this makes a point invalid., type: float, default: 25}
  seed: {description: Prompt seed., type: int, default: 0}
  provenance: {description: "What the role knows (profile, revision, argv, TP/EP, GPU facts); merged into the result.", type: dict, default: {}}
  server_pid: {description: Main PID of the server; its NCCL_*/VLLM_*/CUDA_* environment (no secrets) goes into provenance., type: int, default: 0}
  result_path: {description: Where to write the result JSON on the host., type: path, required: true}
  baseline: {description: "Stored headline figures to gate against (single_stream_output_tok_s, peak_output_tok_s).", type: dict}
  baseline_tolerance: {description: Allowed shortfall against the baseline., type: float, default: 0.1}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - modelfleet.fleet.modelfleet.server
attributes:
  platform:
    platforms: posix
  check_mode: {support: full}
  diff_mode: {support: none}
"""

EXAMPLES = r"""
- name: Sweep 1..64
  modelfleet.fleet.vllm_bench:
    url: http://127.0.0.1:8000
    served_name: kimi-k2.5
    max_concurrency: 64
    input_len: 1024
    output_len: 256
    result_path: /var/lib/modelfleet/bench/run-1/kimi-k2.5.json
"""

RETURN = r"""
headline: {description: "single_stream_output_tok_s, peak_output_tok_s, peak_concurrency.", returned: success, type: dict}
knee: {description: "knee_concurrency, plateau_concurrency, cause, summary.", returned: success, type: dict}
headline_text: {description: "The headline in one line (figures of invalid points are \"not measured\", with the reasons).", returned: success, type: str}
points: {description: 'Per point - C, output tok/s, median TTFT/TPOT/E2E, valid, reasons.', returned: success, type: list}
gate: {description: The baseline comparison when a baseline is given., returned: when baseline, type: dict}
result_path: {description: The JSON written., returned: always, type: str}
levels: {description: The concurrency levels., returned: always, type: list}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.arg_specs import SERVER
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.bench_run import BenchRunError, run_benchmark


def main():
    module = AnsibleModule(
        argument_spec={
            **SERVER,
            "endpoint": {"type": "str", "choices": ["completions", "chat"], "default": "completions"},
            "input_len": {"type": "int", "default": 128},
            "output_len": {"type": "int", "default": 128},
            "vocab_size": {"type": "int", "default": 0},
            "max_concurrency": {"type": "int", "default": 16},
            "concurrency_levels": {"type": "list", "elements": "int"},
            "request_rate": {"type": "float", "default": 0},
            "per_level": {"type": "int", "default": 4},
            "repeat": {"type": "int", "default": 1},
            "min_prompts": {"type": "int", "default": 8},
            "max_prompts": {"type": "int", "default": 2000},
            "warmup": {"type": "int", "default": 2},
            "processes": {"type": "int", "default": 0},
            "kv_tokens_capacity": {"type": "int", "default": 0, "no_log": False},
            "goodput_ttft_ms": {"type": "float"},
            "goodput_tpot_ms": {"type": "float"},
            "reconcile_tolerance": {"type": "float", "default": 0.02},
            "workload": {"type": "str", "default": "random", "choices": ["random", "shared-prefix", "multi-turn"]},
            "prefix_len": {"type": "int", "default": 0},
            "turns": {"type": "int", "default": 3},
            "thinking_budget": {"type": "int"},
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
    try:
        module.exit_json(**run_benchmark(module.params, check_mode=module.check_mode))
    except BenchRunError as err:
        module.fail_json(msg=str(err), **err.details)


if __name__ == "__main__":
    main()
