"""The CLI's progress when its output is a log (issue 22): one line per host and phase, never a re-drawn table;
the live table only on a terminal or with --progress."""

from __future__ import annotations

import argparse
import io

from modelfleet import cli, runner


def _ev(host, role, task, kind="runner_on_ok", play="Canary wave - x", msg=None):
    res = {"msg": "did not become ready"} if kind == "runner_on_failed" else ({"msg": msg} if msg else {})
    return {"event": kind, "event_data": {"host": host, "role": role, "task": task, "play": play, "res": res}}


def test_a_log_gets_one_line_per_host_and_phase_the_failure_and_throttled_progress(tmp_path):
    out, now = io.StringIO(), [0.0]
    ctx, on_event = cli._progress_lines(out, every_s=10, clock=lambda: now[0])
    t = runner._Tracker(on_event, tmp_path / "events.jsonl")
    with ctx:
        for at, ev in ((1, _ev("h1", "hf_fetch", "resolve")), (2, _ev("h1", "hf_fetch", "b")),
                       (3, _ev("h2", "hf_fetch", "resolve")),
                       (4, _ev("h1", "hf_fetch", "Download progress", msg="100 MB of 600 MB, 50 MB/s, ETA 10 s")),
                       (6, _ev("h1", "hf_fetch", "Download progress", msg="200 MB of 600 MB, 50 MB/s, ETA 8 s")),
                       (15, _ev("h1", "hf_fetch", "Download progress", msg="600 MB of 600 MB, 50 MB/s, ETA 0 s")),
                       (16, _ev("h1", "vllm_service", "c")),
                       (17, _ev("h1", "vllm_service", "start it", kind="runner_on_failed"))):
            now[0] = at
            t(ev)
    t.close()
    lines = [line.split("]", 1)[1].split(None, 1) for line in out.getvalue().splitlines()]
    assert lines == [
        ["h1", "fetch: resolve"], ["h2", "fetch: resolve"],
        ["h1", "fetch: 100 MB of 600 MB, 50 MB/s, ETA 10 s"],   # 6 s: within 10 s of the last line, not printed
        ["h1", "fetch: 600 MB of 600 MB, 50 MB/s, ETA 0 s"],
        ["h1", "serve: c"], ["h1", "FAILED in serve: start it: did not become ready"]]
    assert out.getvalue().splitlines()[0].startswith("[     1 s]")
    assert "\x1b" not in out.getvalue() and "┃" not in out.getvalue() and "─" not in out.getvalue()


def test_the_table_is_for_terminals_or_asked_for(monkeypatch):
    monkeypatch.setattr("sys.stdout.isatty", lambda: False, raising=False)
    live, _ = cli._progress(argparse.Namespace(json=False, progress=False))
    assert type(live).__name__ == "nullcontext"
    live, _ = cli._progress(argparse.Namespace(json=False, progress=True))
    assert type(live).__name__ == "Live"
    assert cli._progress(argparse.Namespace(json=True, progress=True)) == (None, None)
