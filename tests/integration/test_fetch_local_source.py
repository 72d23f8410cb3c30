"""hf_fetch with hf_fetch_local_source (offline / shared storage): the role copies a complete model from a
directory on the host, verifies it against that model's own lock, and never contacts a hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT, TINY_REPO, run_local_play

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: modelfleet.fleet.hf_fetch
      vars:
        hf_fetch_repo_id: {repo}
        hf_fetch_revision: {rev}
        hf_fetch_root: {root}
        hf_fetch_local_source: {source}
        hf_fetch_endpoint: http://127.0.0.1:9
    - ansible.builtin.copy:
        dest: {out}
        content: "{{{{ hf_fetch_outcome | to_json }}}}"
        mode: "0600"
"""


def _module(name, args):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    r = subprocess.run(["ansible", "localhost", "-c", "local", "-i", "localhost,", "-m", f"modelfleet.fleet.{name}",
                        "-a", json.dumps(args),
                        "-e", f"ansible_python_interpreter={sys.executable}"], capture_output=True, text=True,
                       cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-2000:]
    return json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_local_source_is_copied_and_verified_without_a_hub(hub, tmp_path):
    shared = tmp_path / "shared"
    lock = _module("hf_lock", {"repo_id": TINY_REPO, "revision": "v1", "endpoint": hub.url,
                               "root": str(shared)})["lock"]
    src = _module("hf_snapshot", {"root": str(shared), "lock": lock, "endpoint": hub.url})["final"]
    root, out = tmp_path / "models", tmp_path / "outcome.json"
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(repo=TINY_REPO, rev=lock["revision"], root=root, source=src, out=out))
    r = run_local_play(play)
    assert r.returncode == 0, r.stdout[-3000:]
    outcome = json.loads(out.read_text())
    assert outcome["source"] == "local" and outcome["revision"] == lock["revision"]
    final = root / "modelfleet-test--tiny-llama" / lock["revision"]
    assert (final / ".modelfleet" / "complete").exists()
    for f in lock["files"]:
        assert (final / f["name"]).stat().st_size == f["size"]
    # a corrupted source is refused: nothing marked complete
    victim = os.path.join(src, "model-00001-of-00003.safetensors")
    data = bytearray(open(victim, "rb").read())
    data[100] ^= 0xFF
    open(victim, "wb").write(bytes(data))
    root2 = tmp_path / "models2"
    play.write_text(PLAY.format(repo=TINY_REPO, rev=lock["revision"], root=root2, source=src, out=out))
    r = run_local_play(play)
    assert r.returncode != 0 and "sha256" in r.stdout
    assert not (root2 / "modelfleet-test--tiny-llama" / lock["revision"] / ".modelfleet" / "complete").exists()
