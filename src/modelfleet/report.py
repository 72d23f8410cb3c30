"""Benchmark reports on the controller: per host JSON, CSV, PNG and HTML; a comparison across results.

The JSON is the client's result as is (field names compatible with `vllm bench serve --save-result` where
the meaning is the same) plus provenance. The plot shows output throughput (left axis) and median E2E
latency and TPOT (right axis) against concurrency, the knee marked and invalid points crossed out.
"""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import bench

THROUGHPUT_COLOR = "#1f77b4"
LATENCY_COLOR = "#d62728"
TPOT_COLOR = "#ff7f0e"

CSV_FIELDS = [
    "max_concurrency", "request_rate", "offered_load", "num_prompts", "completed", "failed", "duration",
    "output_throughput", "total_token_throughput", "request_throughput", "request_goodput",
    "output_tokens_per_user_s", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms",
    "mean_e2el_ms", "median_e2el_ms", "p90_e2el_ms", "p99_e2el_ms", "mean_queue_ms", "p99_queue_ms",
    "median_ttfa_ms", "p99_ttfa_ms", "reasoning_share", "total_output_tokens",
    "server_generation_tokens", "reconcile_diff", "client_cpu_fraction_max", "client_loop_lag_p99_ms",
    "client_processes", "server_requests_waiting_max", "server_kv_cache_usage_max", "kv_bound_concurrency",
    "beyond_kv_bound", "valid", "invalid_reasons",
]


def write_csv(result: dict, path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for p in result["points"]:
            row = dict(p)
            row["invalid_reasons"] = "; ".join(p.get("invalid_reasons") or [])
            row["reasoning_share"] = (p.get("reasoning") or {}).get("reasoning_share")
            w.writerow(row)


def plot(result: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted(result["points"], key=lambda p: p["max_concurrency"])
    xs = [p["max_concurrency"] for p in pts]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(xs, [p["output_throughput"] for p in pts], "o-", color=THROUGHPUT_COLOR, lw=2.5,
            label="output throughput (tok/s)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tok/s", color=THROUGHPUT_COLOR)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax2 = ax.twinx()
    ax2.plot(xs, [p["median_e2el_ms"] for p in pts], "s-", color=LATENCY_COLOR, lw=2.5,
             label="median E2E latency (ms)")
    ax2.plot(xs, [p["median_tpot_ms"] for p in pts], "^--", color=TPOT_COLOR, lw=1.5, label="median TPOT (ms)")
    ax2.set_ylabel("latency (ms)", color=LATENCY_COLOR)
    bad = [p for p in pts if not p.get("valid", True)]
    if bad:
        ax.plot([p["max_concurrency"] for p in bad], [p["output_throughput"] for p in bad], "x", color="black",
                ms=12, mew=2, label="invalid point")
    knee = (result.get("knee") or {}).get("knee_concurrency")
    if knee:
        ax.axvline(knee, color="gray", ls=":", lw=1.5)
        ax.annotate(f"knee C={knee}", (knee, ax.get_ylim()[1]), textcoords="offset points", xytext=(4, -14),
                    color="dimgray")
    _finish_plot(fig, ax, ax2, path, title)


def _finish_plot(fig, ax, ax2, path: Path, title: str) -> None:
    """One legend for both axes, the title and grid, and the PNG written."""
    import matplotlib.pyplot as plt

    lines, lines2 = ax.get_legend_handles_labels(), ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_capacity(result: dict, path: Path, title: str) -> None:
    """A capacity search: each probe's p99 latencies against its load (rate or concurrency) with the targets as
    dashed lines, met probes filled and missed ones crossed, the capacity marked; completed req/s (with its 95%
    interval from repeated runs) on the right axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cap = result["capacity"]
    pts = sorted(result["points"], key=lambda p: p["offered_load"])
    xs = [p["offered_load"] for p in pts]
    met = {pr["load"]: pr["meets"] for pr in cap["probes"]}
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    colors = {"ttft_p99_ms": LATENCY_COLOR, "tpot_p99_ms": TPOT_COLOR, "e2el_p99_ms": "#9467bd"}
    for key, field in bench.SLO_FIELDS.items():
        if key not in cap["slo"]:
            continue
        ys = [p.get(field) for p in pts]
        ax.plot(xs, ys, "-", color=colors[key], lw=2, label=f"{bench.SLO_WORDS[key]} (ms)")
        for x, y in zip(xs, ys, strict=True):
            ax.plot([x], [y], "o" if met.get(x) else "x", color=colors[key], ms=8, mew=2)
        ax.axhline(cap["slo"][key], color=colors[key], ls="--", lw=1.2, label=f"target {cap['slo'][key]:g} ms")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("offered request rate (req/s, Poisson)" if cap["mode"] == "rate" else "concurrency")
    ax.set_ylabel("latency (ms)")
    ax2 = ax.twinx()
    ci = [(p.get("ci_request_throughput") or {}).get("half_width") or 0.0 for p in pts]
    ax2.errorbar(xs, [p["request_throughput"] for p in pts], yerr=ci, fmt="s:", color=THROUGHPUT_COLOR, lw=1.5,
                 capsize=4, label="completed req/s (95% CI)")
    ax2.set_ylabel("completed req/s", color=THROUGHPUT_COLOR)
    if cap.get("capacity") is not None:
        ax.axvline(cap["capacity"], color="green", ls=":", lw=2)
        ax.annotate(f"capacity {cap['capacity']:g}", (cap["capacity"], ax.get_ylim()[1]), textcoords="offset points",
                    xytext=(4, -14), color="green")
    _finish_plot(fig, ax, ax2, path, title)


def _fmt(v, nd=1, escape=True):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return html.escape(str(v)) if escape else str(v)


def write_html(result: dict, path: Path, png_name: str, title: str) -> None:
    # the error bars (95%, Student-t): throughput over repeated runs, mean TTFT over the point's requests
    def gpu_util(p):
        gs = [g["util_pct_mean"] for g in (p.get("telemetry") or {}).get("gpus") or []
              if g.get("util_pct_mean") is not None]
        return sum(gs) / len(gs) if gs else None

    # telemetry during the point: the server's CPU in cores, the GPUs' mean utilisation
    pts = [dict(p, out_ci=(p.get("ci_output_throughput") or {}).get("half_width"),
                ttft_ci=(p.get("ci_ttft_ms") or {}).get("half_width"),
                server_cores=(p.get("telemetry") or {}).get("server_cpu_cores_mean"), gpu_util=gpu_util(p))
           for p in sorted(result["points"], key=lambda p: (p.get("max_concurrency") or 0, p.get("offered_load") or 0))]
    cols = [("C", "max_concurrency"), ("rate", "request_rate"), ("prompts", "num_prompts"),
            ("out tok/s", "output_throughput"), ("req/s", "request_throughput"),
            ("out tok/s ±95%", "out_ci"), ("TTFT mean ±95% ms", "ttft_ci"),
            ("tok/s/user", "output_tokens_per_user_s"), ("TTFT p50 ms", "median_ttft_ms"),
            ("TTFT p99 ms", "p99_ttft_ms"), ("TPOT p50 ms", "median_tpot_ms"), ("ITL p99 ms", "p99_itl_ms"),
            ("E2E p50 ms", "median_e2el_ms"), ("E2E p99 ms", "p99_e2el_ms"), ("client queue p99 ms", "p99_queue_ms"),
            ("server tokens", "server_generation_tokens"), ("diff", "reconcile_diff"),
            ("client CPU", "client_cpu_fraction_max"), ("server CPU cores", "server_cores"),
            ("GPU util %", "gpu_util"), ("waiting max", "server_requests_waiting_max"),
            ("KV max", "server_kv_cache_usage_max")]
    if any(p.get("reasoning") for p in pts):  # a reasoning model: the time to the answer's first token
        cols[9:9] = [("TTFA p50 ms", "median_ttfa_ms"), ("TTFA p99 ms", "p99_ttfa_ms"),
                     ("reasoning share", "reasoning_share")]
        pts = [dict(p, reasoning_share=(p.get("reasoning") or {}).get("reasoning_share")) for p in pts]
    head = "".join(f"<th>{html.escape(c)}</th>" for c, _ in cols) + "<th>valid</th>"
    rows = []
    for p in pts:
        cells = "".join(f"<td>{_fmt(p.get(k), 3 if k in ('reconcile_diff', 'client_cpu_fraction_max') else 1)}</td>"
                        for _, k in cols)
        note = "yes" if p.get("valid", True) else "no: " + html.escape("; ".join(p.get("invalid_reasons") or []))
        if p.get("beyond_kv_bound"):
            note += " (beyond the KV bound)"
        rows.append(f"<tr>{cells}<td>{note}</td></tr>")
    prov = html.escape(json.dumps(result.get("provenance", {}), indent=2, sort_keys=True))
    formulas = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>"
                       for k, v in result.get("formulas", {}).items())
    h = result.get("headline", {})
    # the method export: each point as other tools' command lines (bench.equivalent_commands)
    export = "".join(
        f"<details><summary>C={_fmt(p.get('max_concurrency'))}, rate {_fmt(p.get('request_rate'))}, "
        f"{_fmt(p.get('num_prompts'))} prompts</summary>"
        + "".join(f"<p>{html.escape(tool)}</p><pre>{html.escape(cmd)}</pre>"
                  for tool, cmd in p["equivalent_commands"].items() if tool != "note")
        + f"<p><i>{html.escape(p['equivalent_commands'].get('note', ''))}</i></p></details>"
        for p in pts if p.get("equivalent_commands"))
    doc = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}pre{{background:#f6f6f6;padding:1em}}</style>
</head><body>
<h1>{html.escape(title)}</h1>
<p>Single stream: <b>{_fmt(h.get('single_stream_output_tok_s'))}</b> output tok/s.
Peak: <b>{_fmt(h.get('peak_output_tok_s'))}</b> output tok/s at C={_fmt(h.get('peak_concurrency'))}.</p>
<p>Knee: {html.escape((result.get('knee') or {}).get('summary', '-'))}</p>
<p><b>{html.escape((result.get('capacity') or {}).get('text', ''))}</b></p>
<img src="{html.escape(png_name)}" alt="throughput and latency vs concurrency">
<h2>Points</h2><table><tr>{head}</tr>{''.join(rows)}</table>
<h2>Reproduce with your own tool</h2>{export or '<p>-</p>'}
<h2>Formulas</h2><ul>{formulas}</ul>
<h2>Provenance</h2><pre>{prov}</pre>
</body></html>
"""
    path.write_text(doc)


def write_reports(result: dict, out_dir: Path, name: str) -> dict:
    """JSON, CSV, PNG and HTML for one result; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    prov = result.get("provenance", {})
    title = f"{name}: {prov.get('model_repo', result.get('model_id'))}@{str(prov.get('revision', ''))[:12]}"
    paths = {k: out_dir / f"{name}.{k}" for k in ("json", "csv", "png", "html")}
    paths["json"].write_text(json.dumps(result, indent=2, sort_keys=True))
    write_csv(result, paths["csv"])
    (plot_capacity if result.get("capacity") else plot)(result, paths["png"], title)
    write_html(result, paths["html"], paths["png"].name, title)
    return {k: str(v) for k, v in paths.items()}


def _vs_first(first: dict | None, ci: dict | None) -> str:
    """How a result's peak compares with the first row's: different only when their confidence intervals (repeated
    runs) do not overlap."""
    if first is None:
        return "(first)"
    verdict = bench.differ(first, ci or {})
    if verdict is None:
        return "no interval (run with repeat >= 2)"
    return "different" if verdict else "within noise"


def comparison_rows(results: dict[str, dict]) -> list[dict]:
    """One row per result: the seed's INT4 vs NVFP4 vs MiniMax table shape; with each peak's 95% interval and
    whether it differs from the first row's."""
    rows = []
    first_ci = None
    for i, (name, r) in enumerate(sorted(results.items())):
        prov, h, k = r.get("provenance", {}), r.get("headline", {}), r.get("knee", {})
        rows.append({"name": name, "model": prov.get("model_repo") or r.get("model_id"),
                     "revision": str(prov.get("revision", ""))[:12], "host": prov.get("host", ""),
                     "tp": prov.get("tensor_parallel_size"), "ep": prov.get("expert_parallel"),
                     "single_stream_tok_s": h.get("single_stream_output_tok_s"),
                     "peak_tok_s": h.get("peak_output_tok_s"),
                     "peak_tok_s_ci95": (h.get("peak_output_tok_s_ci") or {}).get("half_width"),
                     "peak_vs_first": _vs_first(first_ci if i else None, h.get("peak_output_tok_s_ci")),
                     "peak_concurrency": h.get("peak_concurrency"),
                     "knee_concurrency": k.get("knee_concurrency"), "knee_cause": k.get("cause"),
                     "valid_points": sum(1 for p in r["points"] if p.get("valid", True)),
                     "points": len(r["points"])})
        if i == 0:
            first_ci = h.get("peak_output_tok_s_ci") or {}
    return rows


def write_comparison(results: dict[str, dict], out_dir: Path) -> dict:
    rows = comparison_rows(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path, html_path = (out_dir / f"comparison.{e}" for e in ("csv", "md", "html"))
    if rows:
        with csv_path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    md_path.write_text(comparison_markdown(rows))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in (rows[0] if rows else []))
    body = "".join("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in r.values()) + "</tr>" for r in rows)
    html_path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>comparison</title></head>"
                         f"<body><h1>Benchmark comparison</h1><table border=1><tr>{head}</tr>{body}</table>"
                         "</body></html>\n")
    return {"csv": str(csv_path), "md": str(md_path), "html": str(html_path)}


def comparison_markdown(rows: list[dict]) -> str:
    if not rows:
        return "(no results)\n"
    cols = ["name", "model", "revision", "tp", "ep", "single_stream_tok_s", "peak_tok_s", "peak_tok_s_ci95",
            "peak_vs_first", "peak_concurrency", "knee_concurrency", "knee_cause"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c), escape=False) for c in cols) + " |")
    return "\n".join(lines) + "\n"
