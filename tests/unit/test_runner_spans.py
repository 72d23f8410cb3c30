"""The runner's phase intervals and the union of their wall time (the summary's seconds per phase, and
what bench_rerun subtracts)."""

from modelfleet.runner import phase_spans, wall_seconds_in


def ev(host, role, start, end=None, kind="runner_on_ok", play="Canary wave - deploy"):
    """A task result as ansible-runner writes it: start and end of the task on that host."""
    data = {"host": host, "role": role, "play": play}
    if end is not None:
        data.update(start=f"2026-12-02T10:00:{start:06.3f}+00:00", end=f"2026-12-02T10:00:{end:06.3f}+00:00")
    return {"event": kind, "created": f"2026-12-02T10:00:{(end or start):06.3f}+00:00", "event_data": data}


def seconds(spans):
    out = {}
    for h, p, a, b in spans:
        out[(h, p)] = round(out.get((h, p), 0) + b - a, 3)
    return out


def test_one_interval_per_task_result_and_phase_names():
    spans = phase_spans([ev("a", "hf_fetch", 1, 3), ev("a", "hf_fetch", 3, 5), ev("b", "hf_fetch", 2, 2.5),
                         ev("a", "vllm_service", 6, 7), ev("a", "", 7, 8), {"event": "playbook_on_start"}])
    assert seconds(spans) == {("a", "fetch"): 4.0, ("b", "fetch"): 0.5, ("a", "serve"): 1.0,
                              ("a", "Canary wave"): 1.0}


def test_a_phase_revisited_later_does_not_swallow_what_came_between():
    # the canary fetches (1..5), serves (5..40), and acts as the fan-out source in a later play (40..42)
    events = [ev("a", "hf_fetch", 1, 5), ev("a", "vllm_service", 5, 40),
              ev("a", "hf_fetch", 40, 42, play="Distribute - x")]
    assert wall_seconds_in(phase_spans(events), {"fetch"}) == 6.0
    assert wall_seconds_in(phase_spans(events), {"serve"}) == 35.0


def test_union_counts_parallel_hosts_once_and_gaps_not_at_all():
    events = [ev("a", "hf_fetch", 1, 5),                          # a: 1..5
              ev("b", "hf_fetch", 3, 8),                          # b: 3..8 overlaps a -> 1..8 = 7
              ev("c", "nvidia_env", 10, 12),                      # gap 8..10 not counted -> +2
              ev("a", "vllm_service", 0, 20)]                     # another phase: ignored
    assert wall_seconds_in(phase_spans(events), {"fetch", "environment"}) == 9.0
    assert wall_seconds_in(phase_spans(events), {"benchmark"}) == 0.0


def test_events_without_start_and_end_count_as_instants():
    events = [ev("a", "hf_fetch", 1), ev("a", "hf_fetch", 5)]
    assert wall_seconds_in(phase_spans(events), {"fetch"}) == 0.0
    assert len(phase_spans(events)) == 2


def test_the_defaults_role_and_the_deploy_steps_are_not_phases_of_their_own():
    """Their tasks count to the play they run in (a role they include is its own phase)."""
    def evr(role, play):
        return {"event": "runner_on_ok", "event_data": {"host": "a", "role": role, "play": play,
                                                          "start": "2026-01-01T00:00:01", "end": "2026-01-01T00:00:02"}}
    spans = phase_spans([evr("modelfleet", "Canary wave - x"), evr("modelfleet_deploy", "Switch - y"),
                         evr("hf_fetch", "Distribute - z"), evr("modelfleet.fleet.nvidia_env", "Switch - y"),
                         evr("modelfleet.fleet.modelfleet_deploy", "Switch - y")])
    # ansible-runner names a role by its short name (resolved_role holds the FQCN); an FQCN maps the same way
    assert [p for _, p, _, _ in spans] == ["Canary wave", "Switch", "fetch", "environment", "Switch"]
