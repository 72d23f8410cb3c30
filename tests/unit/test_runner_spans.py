"""The runner's phase spans and the union of their wall time (what bench_rerun subtracts)."""

from modelfleet.runner import phase_spans, wall_seconds_in


def ev(host, role, t, kind="runner_on_ok", play="Canary wave - deploy"):
    return {"event": kind, "created": f"2026-12-02T10:00:{t:06.3f}",
            "event_data": {"host": host, "role": role, "play": play}}


def test_spans_per_host_and_phase():
    spans = phase_spans([ev("a", "hf_fetch", 1), ev("a", "hf_fetch", 5), ev("b", "hf_fetch", 2),
                         ev("a", "vllm_service", 6), ev("a", "", 7), {"event": "playbook_on_start"}])
    got = {(h, p): round(b - a, 3) for h, p, a, b in spans}
    assert got == {("a", "fetch"): 4.0, ("b", "fetch"): 0.0, ("a", "serve"): 0.0, ("a", "Canary wave"): 0.0}


def test_union_counts_parallel_hosts_once_and_gaps_not_at_all():
    events = [ev("a", "hf_fetch", 1), ev("a", "hf_fetch", 5),      # a: 1..5
              ev("b", "hf_fetch", 3), ev("b", "hf_fetch", 8),      # b: 3..8 overlaps a -> 1..8 = 7
              ev("c", "nvidia_env", 10), ev("c", "nvidia_env", 12),  # gap 8..10 not counted -> +2
              ev("a", "vllm_service", 0), ev("a", "vllm_service", 20)]  # another phase: ignored
    assert wall_seconds_in(phase_spans(events), {"fetch", "environment"}) == 9.0
    assert wall_seconds_in(phase_spans(events), {"benchmark"}) == 0.0
