"""The CLI's progress when its output is a log (issue 22): one line per host and phase, never a re-drawn table;
the live table only on a terminal or with --progress."""

from __future__ import annotations

import argparse
import io

from modelfleet import cli, runner


def _ev(host, role, task, kind="runner_on_ok", play="Canary wave - x"):
    res = {"msg": "did not become ready"} if kind == "runner_on_failed" else {}
    return {"event": kind, "event_data": {"host": host, "role": role, "task": task, "play": play, "res": res}}


def test_a_log_gets_one_line_per_host_and_phase_and_the_failure(tmp_path):
    out = io.StringIO()
    ctx, on_event = cli._progress_lines(out)
    t = runner._Tracker(on_event, tmp_path / "events.jsonl")
    with ctx:
        for ev in (_ev("h1", "hf_fetch", "a"), _ev("h1", "hf_fetch", "b"), _ev("h2", "hf_fetch", "a"),
                   _ev("h1", "vllm_service", "c"), _ev("h1", "vllm_service", "start it", kind="runner_on_failed")):
            t(ev)
    t.close()
    lines = out.getvalue().splitlines()
    assert [line.split("]", 1)[1].split() for line in lines] == [
        ["h1", "fetch"], ["h2", "fetch"], ["h1", "serve"],
        ["h1", "FAILED", "in", "serve:", "start", "it:", "did", "not", "become", "ready"]]
    assert "\x1b" not in out.getvalue() and "┃" not in out.getvalue() and "─" not in out.getvalue()


def test_the_table_is_for_terminals_or_asked_for(monkeypatch):
    monkeypatch.setattr("sys.stdout.isatty", lambda: False, raising=False)
    live, _ = cli._progress(argparse.Namespace(json=False, progress=False))
    assert type(live).__name__ == "nullcontext"
    live, _ = cli._progress(argparse.Namespace(json=False, progress=True))
    assert type(live).__name__ == "Live"
    assert cli._progress(argparse.Namespace(json=True, progress=True)) == (None, None)
