"""modelfleet outside its checkout: the collection tarball installed into an empty folder and used by FQCN from a
playbook written elsewhere, and a non-editable wheel whose CLI works from another folder.

Both use only what the checkout builds (ansible-galaxy collection build, pip wheel) and nothing of the checkout
at run time: the playbook's ansible.cfg names only the empty install folder and the collections modelfleet
depends on (.cache/collections, which holds no modelfleet), and the wheel's venv sees the project's pinned
dependencies but not its editable install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.integration


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


PLAYBOOK = """
- name: A playbook of the user's own, using modelfleet.fleet by FQCN
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The collection's module validates the collection's own profile
      modelfleet.fleet.model_profile:
        profile: "{{ lookup('ansible.builtin.file', profile_path) | from_yaml }}"
        source: "{{ profile_path }}"
      register: profile

    - name: The collection's role plans the models root
      ansible.builtin.include_role:
        name: modelfleet.fleet.storage_cleanup
      vars:
        storage_cleanup_root: "{{ models_root }}"
        storage_cleanup_required_bytes: 4096
        storage_cleanup_read_units: false
        storage_cleanup_log_path: "{{ work }}/storage.log"
        storage_cleanup_lock_path: "{{ work }}/storage.lock"

    - name: What they returned
      ansible.builtin.copy:
        content: "{{ {'profile': profile.profile, 'cleanup': storage_cleanup_outcome} | to_json }}"
        dest: "{{ work }}/result.json"
        mode: "0644"
"""


def test_the_collection_tarball_installs_and_serves_a_playbook_written_elsewhere(tmp_path):
    build, colls, ext, models = (tmp_path / n for n in ("build", "colls", "ext", "models"))
    for d in (build, ext, models):
        d.mkdir()
    deps = (ROOT / ".cache" / "collections").resolve()
    assert not (deps / "ansible_collections" / "modelfleet").exists()
    (ext / "ansible.cfg").write_text(f"[defaults]\ncollections_path = {colls}:{deps}\n"
                                     "collections_scan_sys_path = False\ninterpreter_python = auto_silent\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(ext / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    _run([BIN / "ansible-galaxy", "collection", "build", "--output-path", build, ROOT])
    [tarball] = build.glob("modelfleet-fleet-*.tar.gz")
    # the declared dependencies (containers.podman, ansible.posix, community.general) come from Galaxy; offline,
    # the ones scripts/setup.sh extracted stand in for that step
    _run([BIN / "ansible-galaxy", "collection", "install", "--no-deps", "-p", colls, tarball], cwd=ext, env=env)
    installed = colls / "ansible_collections" / "modelfleet" / "fleet"
    assert (installed / "MANIFEST.json").is_file() and not installed.is_symlink()
    manifest = json.loads((installed / "MANIFEST.json").read_text())["collection_info"]
    assert (manifest["namespace"], manifest["name"]) == ("modelfleet", "fleet")
    # what an installed collection must not carry: the checkout's caches, venv, tests and harness (the ansible-test
    # ignore file, tests/sanity, ships)
    for left_out in (".cache", ".venv", "tests/unit", "tests/integration", "tests/conftest.py", "molecule", "src",
                     "scripts"):
        assert not (installed / left_out).exists(), left_out
    assert (installed / "tests" / "sanity" / "ignore-2.19.txt").is_file()

    (ext / "site.yml").write_text(PLAYBOOK)
    listing = _run([BIN / "ansible-galaxy", "collection", "list", "modelfleet.fleet", "--format", "json"],
                   cwd=ext, env=env)
    assert list(json.loads(listing.stdout)) == [str(colls / "ansible_collections")]
    extra = {"profile_path": str(installed / "profiles" / "tiny-llama.yml"), "models_root": str(models),
             "work": str(tmp_path), "ansible_python_interpreter": sys.executable}
    _run([BIN / "ansible-playbook", "-i", "localhost,", "site.yml", "-e", json.dumps(extra)], cwd=ext, env=env)
    result = json.loads((tmp_path / "result.json").read_text())
    want = yaml.safe_load((installed / "profiles" / "tiny-llama.yml").read_text())
    assert result["profile"]["repo_id"] == want["repo_id"]
    plan = result["cleanup"]["plan"]  # the role's module measured the folder the playbook named
    assert plan["root"] == str(models) and plan["required_bytes"] == 4096 and plan["feasible"] is True
    assert plan["free_bytes"] == os.statvfs(models).f_bavail * os.statvfs(models).f_frsize or plan["free_bytes"] > 0
    assert result["cleanup"]["deleted"] == []
    # the collection's own playbooks run by FQCN (syntax and every role they name resolve from the install)
    for playbook in ("modelfleet.fleet.deploy_kimi_int4", "modelfleet.fleet.status", "modelfleet.fleet.cleanup"):
        _run([BIN / "ansible-playbook", "-i", "localhost,", "--syntax-check", playbook], cwd=ext, env=env)


def test_a_non_editable_wheel_runs_the_cli_from_another_folder(tmp_path, tiny_model):
    dist, venv, elsewhere, src = (tmp_path / n for n in ("dist", "venv", "elsewhere", "src"))
    elsewhere.mkdir()
    # built from a copy of the working tree, so setuptools' build/ and egg-info never land in the checkout
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".cache", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "molecule"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, src],
         cwd=tmp_path)
    [wheel] = dist.glob("modelfleet-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    vpy = venv / "bin" / "python"
    purelib = Path(_run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # the pinned dependencies from the project's venv, added as a plain path: its .pth files (the editable install
    # that maps modelfleet onto the checkout) are not run from there
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", vpy, "install", "-q", "--no-deps", "--no-index", wheel])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANSIBLE_CONFIG", "MODELFLEET_REPO")}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    where = _run([vpy, "-c", "from modelfleet import collection; import modelfleet; "
                  "print(collection.root()); print(modelfleet.__file__); print(collection.checkout())"],
                 cwd=elsewhere, env=env).stdout.split()
    assert where[0] == str(purelib / "ansible_collections" / "modelfleet" / "fleet")
    assert where[1].startswith(str(purelib)) and where[2] == "None"

    cli = venv / "bin" / "modelfleet"
    version = _run([cli, "--version"], cwd=elsewhere, env=env).stdout
    assert "0.1.0" in version
    plan_args = [tiny_model, "--gpus", "1", "--gpu-memory-gib", "24", "--interconnect", "single",
                 "--profile", "tiny-llama", "--json"]
    facts = json.loads(_run([cli, "inspect", tiny_model, "--json"], cwd=elsewhere, env=env).stdout)
    assert facts["architecture"] == "LlamaForCausalLM" and facts["num_layers"] == 2 and facts["num_parameters"] > 0
    plan = json.loads(_run([cli, "plan", *plan_args], cwd=elsewhere, env=env).stdout)
    assert plan["tensor_parallel_size"] == 1 and plan["fits"] is True
    # the very answers the checkout's own CLI gives (same logic, same profile, found in the wheel)
    ours = BIN / "modelfleet"
    assert facts == json.loads(_run([ours, "inspect", tiny_model, "--json"], cwd=ROOT).stdout)
    assert plan == json.loads(_run([ours, "plan", *plan_args], cwd=ROOT).stdout)
    # a profile the wheel does not carry is named, with where profiles come from
    r = subprocess.run([cli, "plan", tiny_model, "--gpus", "1", "--gpu-memory-gib", "24", "--profile", "no-such"],
                       capture_output=True, text=True, cwd=elsewhere, env=env, timeout=120)
    assert r.returncode != 0 and "no-such" in r.stderr and "Traceback" not in r.stderr
