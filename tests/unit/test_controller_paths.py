"""The controller's state folder has one rule (issue 21): the runner's run folders, the benchmark role's reports
and vllm_service's compile-cache archives all follow $MODELFLEET_STATE_DIR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.controller_paths import state_dir

ROOT = Path(__file__).resolve().parents[2]


def test_the_variable_wins_else_the_users_state_folder():
    assert state_dir({"MODELFLEET_STATE_DIR": "/srv/mf", "HOME": "/home/a"}) == "/srv/mf"
    assert state_dir({"HOME": "/home/a"}) == "/home/a/.local/state/modelfleet"
    assert state_dir({"MODELFLEET_STATE_DIR": "", "HOME": "/home/a"}) == "/home/a/.local/state/modelfleet"
    assert state_dir({}, home="/h") == "/h/.local/state/modelfleet"


@pytest.mark.parametrize("env", [{"MODELFLEET_STATE_DIR": "/srv/mf-state"}, {}])
def test_the_playbooks_lookup_and_the_runner_agree(env, tmp_path):
    base = {k: v for k, v in os.environ.items() if k != "MODELFLEET_STATE_DIR"}
    full = {**base, **env, "HOME": str(tmp_path), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m",
         "ansible.builtin.debug", "-a",
         "msg={{ [lookup('modelfleet.fleet.state_dir'), lookup('modelfleet.fleet.state_dir', 'compile-cache')]"
         " | to_json }}"],
        capture_output=True, text=True, env=full, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(json.loads(out.stdout.split("=>", 1)[1])["msg"])
    runner = subprocess.run([sys.executable, "-c", "from modelfleet import runner; print(runner.state_dir())"],
                            capture_output=True, text=True, env=full, timeout=60).stdout.strip()
    want = env.get("MODELFLEET_STATE_DIR") or str(tmp_path / ".local/state/modelfleet")
    assert got == [want, want + "/compile-cache"] and runner == want


def test_the_lookup_refuses_a_path_that_leaves_the_folder():
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m",
         "ansible.builtin.debug", "-a", "msg={{ lookup('modelfleet.fleet.state_dir', '../etc') }}"],
        capture_output=True, text=True, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}, cwd=ROOT,
        timeout=120)
    assert out.returncode != 0 and "is not a relative path under the state folder" in out.stdout + out.stderr


def test_the_model_paths_lookup_is_the_layout_hf_lock_returns():
    """Playbooks that know a repo and commit but did not call hf_lock (a local source, the plan, the relay) get
    the model's folders from the same function (fetch.model_paths); a revision that is not a commit is refused."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import model_paths

    rev = "0123456789abcdef0123456789abcdef01234567"
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m",
         "ansible.builtin.debug", "-a",
         "msg={{ lookup('modelfleet.fleet.model_paths', 'moonshotai/Kimi-K2.5', '" + rev + "', root='/srv/models')"
         " | to_json }}"],
        capture_output=True, text=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"},
        cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(json.loads(out.stdout.split("=>", 1)[1])["msg"])
    assert got == model_paths("/srv/models", "moonshotai/Kimi-K2.5", rev)
    assert got["final"] == "/srv/models/moonshotai--Kimi-K2.5/" + rev
    bad = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m",
         "ansible.builtin.debug", "-a",
         "msg={{ lookup('modelfleet.fleet.model_paths', 'moonshotai/Kimi-K2.5', 'main', root='/m') }}"],
        capture_output=True, text=True, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}, cwd=ROOT,
        timeout=120)
    assert bad.returncode != 0 and "model_paths: revision 'main' is not a 40-hex commit" in bad.stdout + bad.stderr
