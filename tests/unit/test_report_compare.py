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


def test_the_report_of_a_reasoning_model_shows_the_time_to_the_answer(tmp_path):
    import csv

    point = {"max_concurrency": 1, "request_rate": "inf", "num_prompts": 4, "output_throughput": 10.0, "valid": True,
             "median_ttft_ms": 20.0, "median_ttfa_ms": 345.6, "p99_ttfa_ms": 456.7,
             "reasoning": {"reasoning_share": 0.75, "requests": 4, "answered": 4}}
    result = {"points": [point], "headline": bench.headline([point]), "knee": {}, "provenance": {}}
    report.write_html(result, tmp_path / "r.html", "r.png", "reasoning")
    page = (tmp_path / "r.html").read_text()
    assert "<th>TTFA p50 ms</th>" in page and "345.6" in page and "<th>reasoning share</th>" in page
    report.write_csv(result, tmp_path / "r.csv")
    (row,) = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert (row["median_ttfa_ms"], row["reasoning_share"]) == ("345.6", "0.75")
    plain = dict(result, points=[{k: v for k, v in point.items() if "ttfa" not in k and k != "reasoning"}])
    report.write_html(plain, tmp_path / "p.html", "p.png", "plain")
    assert "TTFA" not in (tmp_path / "p.html").read_text()
