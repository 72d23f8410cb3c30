"""The deploy record behind the unchanged-host fast path: digests, the record on disk, and every way a
host stops being current (each must send the deploy down its full path)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import deploy_record as dr

ROOT = Path(__file__).resolve().parents[2]
UNIT = "modelfleet-vllm@tiny.service"
SECRET = "hf_secret_token_value_0123456789"


def _units(*names):
    def run(argv, **kw):
        assert argv[:2] == ["systemctl", "list-units"]
        return subprocess.CompletedProcess(argv, 0, "".join(f"{n} loaded active running x\n" for n in names), "")
    return run


class Probe:
    def __init__(self, stage="ready"):
        self.stage, self.calls = stage, []

    def __call__(self, url, name, key):
        self.calls.append((url, name, key))
        return self.stage, f"stage {self.stage}", "text" if self.stage == "ready" else None


def _digest(inputs):
    """As the playbook makes it on the controller: inputs | to_json(sort_keys=true) | hash('sha256')."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


@pytest.fixture
def host(tmp_path):
    """A host as a successful deploy leaves it: unit, env file, venv, complete model, and its record."""
    unit_path = tmp_path / "etc" / UNIT
    unit_path.parent.mkdir()
    unit_path.write_text("[Service]\nExecStart=/opt/venv/bin/python -m vllm\n")
    env = tmp_path / "etc" / "tiny.env"
    env.write_text("VLLM_API_KEY=k123\nHF_TOKEN=\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    sp = venv / "lib" / "python3.11" / "site-packages"
    (sp / "vllm-0.32.0.dist-info").mkdir(parents=True)
    model = tmp_path / "models" / "org--tiny" / ("a" * 40)
    (model / ".modelfleet").mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"x" * 100)
    (model / ".modelfleet" / "lock.json").write_text(json.dumps(
        {"revision": "a" * 40, "files": [{"name": "model.safetensors", "size": 100}]}))
    (model / ".modelfleet" / "complete").write_text("")
    inputs = {"profile": {"name": "tiny", "vllm": {"max_model_len": 512}}, "revision": "a" * 40,
              "variables": {"hf_fetch_token": SECRET, "vllm_service_port": 18501}}
    rec = dr.build_record(inputs_digest=_digest(inputs), summary={"profile": "tiny"}, unit=UNIT,
                          unit_path=str(unit_path), env_file=str(env), model_dir=str(model), venv=str(venv),
                          url="http://127.0.0.1:18501", served_name="tiny",
                          outcome={"fetch": {"model_dir": str(model)}, "unit": {"unit": UNIT}})
    path = tmp_path / "deployed" / "tiny.json"
    assert dr.write_record(str(path), rec) is True
    return {"path": str(path), "inputs": inputs, "unit_path": unit_path, "env": env, "venv": venv, "sp": sp,
            "model": model, "tmp": tmp_path}


def test_a_digest_that_is_not_one_is_refused(host):
    for bad in ("", "abc", "G" * 64, {"inputs": 1}.__repr__()):
        with pytest.raises(dr.RecordError, match="hex sha256"):
            dr.check(host["path"], bad, run=_units(UNIT))


def test_record_on_disk_is_root_only_idempotent_and_holds_no_input(host):
    path = Path(host["path"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert SECRET not in path.read_text()
    rec = dr.read_record(str(path))
    assert rec["unit_sha256"] == dr.file_sha256(str(host["unit_path"]))
    assert rec["model_revision"] == "a" * 40
    # the same record again changes nothing; another one does, and check mode leaves the file alone
    assert dr.write_record(str(path), rec) is False
    before = path.read_text()
    assert dr.write_record(str(path), {**rec, "url": "http://127.0.0.1:1"}, check_mode=True) is True
    assert path.read_text() == before
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".record-")]


def test_unchanged_host_is_current_after_one_readiness_look(host):
    probe = Probe()
    res = dr.check(host["path"], _digest(host["inputs"]), run=_units(UNIT), probe=probe)
    assert res["current"] is True and res["reasons"] == []
    assert probe.calls == [("http://127.0.0.1:18501", "tiny", "k123")]   # the key comes from the env file
    assert res["record"]["outcome"]["unit"]["unit"] == UNIT
    assert SECRET not in json.dumps(res)


def test_changed_inputs_take_the_full_path_without_looking_at_the_server(host):
    probe = Probe()
    inputs = json.loads(json.dumps(host["inputs"]))
    inputs["variables"]["vllm_service_port"] = 18999
    res = dr.check(host["path"], _digest(inputs), run=_units(UNIT), probe=probe)
    assert res["current"] is False and "asks for something else" in res["reasons"][0]
    assert probe.calls == []


@pytest.mark.parametrize("change, expect", [
    (lambda h: h["unit_path"].write_text("[Service]\nExecStart=/bin/false\n"), "unit file"),
    (lambda h: h["unit_path"].unlink(), "is gone"),
    (lambda h: h["env"].write_text("VLLM_API_KEY=other\n"), "environment file"),
    (lambda h: (h["sp"] / "vllm-0.33.0.dist-info").mkdir(), "packages in"),
    (lambda h: (h["venv"] / "bin" / "python").unlink(), "has no python"),
    (lambda h: (h["model"] / ".modelfleet" / "complete").unlink(), "no completion marker"),
    (lambda h: (h["model"] / "model.safetensors").write_bytes(b"x" * 99), "wrong size"),
    (lambda h: (h["model"] / "model.safetensors").unlink(), "wrong size"),
    (lambda h: (h["model"] / ".modelfleet" / "lock.json").write_text(json.dumps({"revision": "b" * 40})),
     "holds commit"),
])
def test_every_drift_on_the_host_is_a_reason(host, change, expect):
    change(host)
    probe = Probe()
    res = dr.check(host["path"], _digest(host["inputs"]), run=_units(UNIT), probe=probe)
    assert res["current"] is False
    assert any(expect in r for r in res["reasons"]), res["reasons"]
    assert probe.calls == []


def test_inactive_unit_other_units_and_a_server_not_ready(host):
    res = dr.check(host["path"], _digest(host["inputs"]), run=_units(), probe=Probe())
    assert res["reasons"] == [f"{UNIT} is not active"]
    both = _units(UNIT, "modelfleet-vllm@other.service")
    res = dr.check(host["path"], _digest(host["inputs"]), run=both, probe=Probe())
    assert res["reasons"] == ["other model units are active: modelfleet-vllm@other.service"]
    res = dr.check(host["path"], _digest(host["inputs"]), run=_units(UNIT), probe=Probe("listed"))
    assert res["current"] is False and "is not ready: stage listed" in res["reasons"][0]


def test_no_record_or_a_foreign_one(host, tmp_path):
    assert "no deploy record" in dr.check(str(tmp_path / "none.json"), _digest({}), run=_units(UNIT))["reasons"][0]
    foreign = tmp_path / "v0.json"
    foreign.write_text(json.dumps({"version": 0, "inputs_digest": _digest({})}))
    assert dr.check(str(foreign), _digest({}), run=_units(UNIT))["current"] is False
    Path(host["path"]).write_text("{not json")
    assert dr.check(host["path"], _digest(host["inputs"]), run=_units(UNIT))["current"] is False


def test_nothing_to_record_is_an_error_that_writes_nothing(host, tmp_path):
    with pytest.raises(dr.RecordError, match="missing"):
        dr.build_record(inputs_digest=_digest({}), summary={}, unit=UNIT, unit_path=str(tmp_path / "absent.service"),
                        env_file=str(host["env"]), model_dir=str(host["model"]), venv=str(host["venv"]),
                        url="u", served_name="tiny", outcome={})


def _code_digest():
    spec = importlib.util.spec_from_file_location("code_digest", ROOT / "plugins" / "lookup" / "code_digest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_code_digest_follows_content_not_caches(tmp_path):
    mod = _code_digest()
    (tmp_path / "roles" / "r").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "main.yml").write_text("a: 1\n")
    d0 = mod.tree_digest([str(tmp_path / "roles")])
    (tmp_path / "roles" / "__pycache__").mkdir()
    (tmp_path / "roles" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (tmp_path / "roles" / "r" / "y.pyc").write_bytes(b"\0")
    assert mod.tree_digest([str(tmp_path / "roles")]) == d0
    (tmp_path / "roles" / "r" / "main.yml").write_text("a: 2\n")
    assert mod.tree_digest([str(tmp_path / "roles")]) != d0
    os.rename(tmp_path / "roles" / "r" / "main.yml", tmp_path / "roles" / "r" / "other.yml")
    assert mod.tree_digest([str(tmp_path / "roles")]) not in (d0,)
    assert all(os.path.isdir(f) for f in mod.DEFAULT_FOLDERS)


def test_the_inputs_are_the_role_variables_less_what_a_run_publishes_or_only_paces():
    variables = {"vllm_service_port": 8000, "hf_fetch_token": "t", "benchmark_max_concurrency": 4,
                 "storage_cleanup_root": "/models", "nvidia_env_vllm_version": "0.32.0", "modelfleet_models_root": "/m",
                 "vllm_service_outcome": {}, "modelfleet_serial": 2, "modelfleet_wave": "rest",
                 "modelfleet_rollout": {}, "modelfleet_profile_name": "p", "modelfleet_fast_path": True,
                 "modelfleet_canary_passed": True,
                 "modelfleet_endpoints": [{"name": "g", "port": 8080, "hosts": ["h"]}],
                 "modelfleet_endpoint": {"host": "h", "name": "g"},
                 "ansible_port": 22, "inventory_hostname": "h", "my_var": 1}
    assert sorted(dr.input_variables(variables)) == [
        "benchmark_max_concurrency", "hf_fetch_token", "modelfleet_models_root", "nvidia_env_vllm_version",
        "storage_cleanup_root", "vllm_service_port"]


def test_the_digest_changes_with_every_input_and_nothing_else():
    base = dict(profile={"served_model_name": "m"}, revision="a" * 40, plan={"tp": 8}, driver="580.1", code="c",
                variables={"vllm_service_port": 8000, "modelfleet_wave": "canary"})
    d = dr.inputs_digest(**base)
    assert len(d) == 64 and d == dr.inputs_digest(**base)
    assert dr.inputs_digest(**{**base, "variables": {"vllm_service_port": 8000, "modelfleet_wave": "rest",
                                                     "inventory_hostname": "other"}}) == d
    for change in ({"profile": {"served_model_name": "n"}}, {"revision": "b" * 40}, {"plan": {"tp": 4}},
                   {"driver": "580.2"}, {"code": "d"}, {"variables": {"vllm_service_port": 8001}}):
        assert dr.inputs_digest(**{**base, **change}) != d, change


def test_the_playbooks_filter_is_the_same_digest():
    import json
    import os
    import sys

    inputs = {"profile": {"served_model_name": "m"}, "revision": "a" * 40, "plan": {}, "driver": "", "code": "c",
              "variables": {"vllm_service_port": 8000, "vllm_service_outcome": {"x": 1}}}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m",
         "ansible.builtin.debug", "-a",
         json.dumps({"msg": "{{ " + json.dumps(inputs) + " | modelfleet.fleet.deploy_inputs_digest }}"})],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout.split("=>", 1)[1])["msg"] == dr.inputs_digest(**inputs)
