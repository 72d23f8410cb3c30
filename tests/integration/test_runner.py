"""The runner wrapper and the fleet CLI against the real local fleet (three systemd containers):
a playbook through the Python API (per-host results, the event stream, idempotence), status, the
CLI's --json output and live display, and a bad profile refused before any host is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelfleet import runner

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("local-fleet")]

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "inventory" / "local" / "local.fleet.yml"
NODES = ["mf-node-1", "mf-node-2", "mf-node-3"]


@pytest.fixture(scope="module")
def local_fleet(tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    old = os.environ.get("MODELFLEET_STATE_DIR")
    os.environ["MODELFLEET_STATE_DIR"] = str(state)
    # fresh hosts: a local fleet the demo left serving would make "serves nothing" false (it is removed at the end
    # either way)
    subprocess.run([str(ROOT / "scripts" / "fleet.sh"), "down"], capture_output=True, timeout=300)
    up = subprocess.run([str(ROOT / "scripts" / "fleet.sh"), "up"], capture_output=True, text=True, timeout=900)
    assert up.returncode == 0, up.stderr
    yield state
    subprocess.run([str(ROOT / "scripts" / "fleet.sh"), "down"], capture_output=True, timeout=300)
    if old is None:
        os.environ.pop("MODELFLEET_STATE_DIR", None)
    else:
        os.environ["MODELFLEET_STATE_DIR"] = old


def test_playbook_through_the_python_api(local_fleet):
    seen = []
    res = runner.run_playbook("smoke.yml", inventory=str(FLEET), on_event=lambda ev, hosts: seen.append(ev["event"]))
    assert res.ok and res.rc == 0 and res.status == "successful", {h: v.failure for h, v in res.hosts.items()}
    assert sorted(res.hosts) == NODES
    for h in res.hosts.values():
        assert h.status == "ok" and h.failed == 0 and h.ok > 0
        assert "smoke" in h.phases
    assert seen[0] == "playbook_on_start" and seen[-1] == "playbook_on_stats"
    assert "runner_on_ok" in seen and len(seen) == res.events
    run_dir = Path(res.run_dir)
    assert run_dir.parent == local_fleet / "runs"
    assert (run_dir / "result.json").exists() and (run_dir / "events.jsonl").exists()
    assert len((run_dir / "events.jsonl").read_text().splitlines()) == res.events
    assert (run_dir / "artifacts" / res.run_id / "stdout").exists()
    saved = json.loads((run_dir / "result.json").read_text())
    assert saved["ok"] is True and set(saved["hosts"]) == set(NODES)

    again = runner.run_playbook("smoke.yml", inventory=str(FLEET))
    assert again.ok and all(h.changed == 0 for h in again.hosts.values())
    assert again.run_dir != res.run_dir


def test_limit_and_check_mode(local_fleet):
    res = runner.run_playbook("smoke.yml", inventory=str(FLEET), limit="canary", check=True)
    assert res.ok and sorted(res.hosts) == ["mf-node-1"] and res.check


def test_status_reads_the_hosts(local_fleet):
    res = runner.status(inventory=str(FLEET))
    assert res.ok, {h: v.failure for h, v in res.hosts.items()}
    for name in NODES:
        st = res.hosts[name].facts["modelfleet_status_outcome"]
        assert st["serving"] == [] and isinstance(st["models"], list) and "last_benchmark" in st


def _cli(*args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "modelfleet.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)


def test_cli_status_json_and_live_display(local_fleet):
    r = _cli("status", "-i", str(FLEET), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["ok"] is True and sorted(data["hosts"]) == NODES
    assert data["hosts"]["mf-node-2"]["facts"]["modelfleet_status_outcome"]["serving"] == []
    live = _cli("status", "-i", str(FLEET), "--progress", env_extra={"COLUMNS": "140"})
    assert live.returncode == 0, live.stderr
    assert "phase" in live.stdout and "mf-node-3" in live.stdout and "serving nothing" in live.stdout


def test_cli_deploy_unknown_profile_touches_nothing(local_fleet):
    r = _cli("deploy", "no-such-profile", "-i", str(FLEET), "--json")
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["ok"] is False
    assert "no-such-profile" in data["hosts"]["localhost"]["failure"]
    assert set(data["hosts"]) == {"localhost"}  # no fleet host ran a task
