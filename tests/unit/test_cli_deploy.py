"""`modelfleet deploy` without a profile (issue 21): the playbook gets no profile name, and the summary opens with
the rollout plan the controller published (the fact the runner keeps besides the *_outcome ones)."""

from __future__ import annotations

import json

from modelfleet import cli, runner

PLAN = {"text": "wave 1 canary (canary): 1 host(s), all at once, max 0% failed per batch\n"
                "  batch 1: fleet-1 (tiny-llama)\n"
                "wave 2 rest: 2 host(s), serial 1, max 0% failed per batch\n"
                "  batch 1: fleet-3 (tiny-llama-b)\n  batch 2: fleet-2 (tiny-llama)",
        "left_out": ["fleet-9"]}


def _ok(host, facts):
    return {"event": "runner_on_ok", "event_data": {"host": host, "task": "t", "play": "Preflight on the controller",
                                                    "res": {"ansible_facts": facts}}}


def test_the_runner_keeps_the_plan_and_the_summary_prints_it_first(tmp_path, capsys):
    t = runner._Tracker(None, tmp_path / "events.jsonl")
    t(_ok("localhost", {"modelfleet_rollout_plan": PLAN, "__mf_profiles": {"x": 1}}))
    t(_ok("fleet-1", {"modelfleet_deploy_outcome": {"revision": "57acd6fa976d18", "fetched_from": "hub",
                                                    "bytes": 10, "up_to_date": False}}))
    t.close()
    assert t.hosts["localhost"].facts == {"modelfleet_rollout_plan": PLAN}  # nothing private kept
    res = runner.RunResult("deploy_model.yml", "r", str(tmp_path), True, 0, "successful", 0.0, 1.0, 2, t.hosts)
    cli._deploy_summary(res)
    out = capsys.readouterr().out
    assert out.startswith("\n== rollout plan ==\n" + PLAN["text"] + "\nnot in this run (another profile): fleet-9\n")
    assert out.index("== rollout plan ==") < out.index("== deploy summary ==") < out.index("\nfleet-1 ")
    assert json.loads(json.dumps(res.to_dict()))["hosts"]["localhost"]["facts"]["modelfleet_rollout_plan"] == PLAN


def test_deploy_without_a_profile_names_none(monkeypatch):
    seen = []
    monkeypatch.setattr(runner, "run_playbook", lambda *a: seen.append(a) or "done")
    assert runner.deploy(None, "f.fleet.yml", None, True, {"hf_fetch_endpoint": "http://h"}) == "done"
    assert seen[-1][4] == {"hf_fetch_endpoint": "http://h"}
    runner.deploy("tiny-llama", "f.fleet.yml", None, False, {"x": 1})
    assert seen[-1][4] == {"modelfleet_profile_name": "tiny-llama", "x": 1}
    # an extra variable given on the command line still wins over the positional profile
    runner.deploy("tiny-llama", None, None, False, {"modelfleet_profile_name": "other"})
    assert seen[-1][4]["modelfleet_profile_name"] == "other"
    args = cli.build_parser().parse_args(["deploy", "-i", "f.fleet.yml", "--check"])
    assert args.profile is None and args.check and args.inventory == "f.fleet.yml"
    assert cli.build_parser().parse_args(["deploy", "tiny-llama"]).profile == "tiny-llama"


def test_the_summary_splits_a_hosts_fetch_and_start_times(tmp_path, capsys):
    """Issue 26: per host, the runner's phase times and, from the deploy outcome, the download, verification and
    start-to-ready seconds (a receiver has no download of its own: left out, not shown as 0)."""
    t = runner._Tracker(None, tmp_path / "events.jsonl")
    t(_ok("fleet-1", {"modelfleet_deploy_outcome": {
        "revision": "57acd6fa976d18", "fetched_from": "hub", "bytes": 10, "up_to_date": False,
        "timings": {"download_s": 12.3, "verify_s": 1.2, "ready_s": 40.5}}}))
    t(_ok("fleet-2", {"modelfleet_deploy_outcome": {
        "revision": "57acd6fa976d18", "fetched_from": "origin fleet-1", "bytes": 10, "up_to_date": False,
        "timings": {"download_s": None, "verify_s": None, "ready_s": 22.0}}}))
    t.close()
    res = runner.RunResult("deploy_model.yml", "r", str(tmp_path), False, 0, "successful", 0.0, 1.0, 2, t.hosts)
    cli._deploy_summary(res)
    out = capsys.readouterr().out
    assert "(download 12.3s, verify 1.2s, ready 40.5s)" in out and "(ready 22.0s)" in out
