"""The comparison table calls two results different only when their confidence intervals say so."""

from __future__ import annotations

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench

from modelfleet import report


def _result(tputs: list[float]) -> dict:
    runs = [{"output_throughput": t, "request_throughput": t / 100, "valid": True, "max_concurrency": 16}
            for t in tputs]
    point = bench.merge_repeats(runs)
    return {"points": [point], "headline": bench.headline([point]), "knee": {},
            "provenance": {"model_repo": "o/m", "revision": "0" * 40}}


def test_comparison_marks_a_difference_only_when_the_intervals_do_not_overlap(tmp_path):
    rows = report.comparison_rows({"a-int4": _result([2276, 2250, 2301]), "b-nvfp4": _result([2260, 2290, 2240]),
                                   "c-minimax": _result([4000, 4050, 3980]), "d-once": _result([1200])})
    got = {r["name"]: r["peak_vs_first"] for r in rows}
    assert got == {"a-int4": "(first)", "b-nvfp4": "within noise", "c-minimax": "different",
                   "d-once": "no interval (run with repeat >= 2)"}
    half = {r["name"]: r["peak_tok_s_ci95"] for r in rows}
    assert half["a-int4"] > 0 and half["d-once"] is None
    md = report.comparison_markdown(rows)
    assert "peak_vs_first" in md.splitlines()[0] and "| within noise |" in md and "| different |" in md
