"""Remote inspection through the real huggingface_hub client against the local hub server: by
revision, with sha256 per file, headers by range requests."""

from __future__ import annotations

import hashlib

import pytest
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.checkpoint import inspect_hub, inspect_local
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import CheckpointError

from tests.conftest import TINY_REPO


def test_inspect_by_tag_and_commit(hub, tiny_model):
    repo = hub.extra["repos"][TINY_REPO]
    by_tag = inspect_hub(TINY_REPO, revision="v1", endpoint=hub.url)
    assert by_tag["revision"] == repo["tag_v1"]
    by_main = inspect_hub(TINY_REPO, revision="main", endpoint=hub.url)
    assert by_main["revision"] == repo["main"] != by_tag["revision"]
    local = inspect_local(str(tiny_model))
    for key in ("architecture", "attention", "num_shards", "num_parameters", "bytes_by_dtype", "tensor_bytes"):
        assert by_tag[key] == local[key], key
    files = {f["name"]: f for f in by_tag["files"]}
    for p in tiny_model.glob("*.safetensors"):
        assert files[p.name]["size"] == p.stat().st_size
        assert files[p.name]["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()


def test_remote_header_read_moves_only_header_bytes(hub, tiny_model):
    """With Range honoured, the client reads the 1 MiB prefix request's body only up to the header."""
    reads = {}
    inspect_hub(TINY_REPO, revision="v1", endpoint=hub.url, on_read=lambda n, b: reads.__setitem__(n, b))
    for p in tiny_model.glob("*.safetensors"):
        assert reads[p.name] <= p.stat().st_size  # tiny shards are below the 1 MiB first request


@pytest.mark.parametrize("repo,rev,needle", [
    ("modelfleet-test/absent", "main", "repository not found"),
    (TINY_REPO, "f" * 40, "revision 'ffff"),
    (TINY_REPO, "no-such-tag", "revision 'no-such-tag' not found"),
])
def test_remote_errors(hub, repo, rev, needle):
    with pytest.raises(CheckpointError, match=needle):
        inspect_hub(repo, revision=rev, endpoint=hub.url)


def test_endpoint_down():
    with pytest.raises(CheckpointError, match="cannot reach the hub"):
        inspect_hub(TINY_REPO, revision="main", endpoint="http://127.0.0.1:9")


def test_module_through_ansible(hub, tiny_model, tmp_path):
    """The Ansible module shell, run by ansible itself on localhost."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    r = subprocess.run(["ansible", "localhost", "-c", "local", "-i", "localhost,",
                        "-m", "modelfleet.fleet.checkpoint_inspect",
                        "-a", f"repo_id={TINY_REPO} revision=v1 endpoint={hub.url}",
                        "-e", f"ansible_python_interpreter={sys.executable}"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    facts = out["plays"][0]["tasks"][0]["hosts"]["localhost"]["checkpoint"]
    assert facts["revision"] == hub.extra["repos"][TINY_REPO]["tag_v1"]
    r = subprocess.run(["ansible", "localhost", "-c", "local", "-i", "localhost,",
                        "-m", "modelfleet.fleet.checkpoint_inspect",
                        "-a", f"path={tmp_path}", "-e", f"ansible_python_interpreter={sys.executable}"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode != 0 and "no config.json" in r.stdout


def test_shard_headers_are_read_at_once_with_the_same_facts(hub):
    """Issue 23 (preflight): with a far-away hub (each request waits 0.3 s on the hub server) the shard headers
    are read concurrently - the hub sees several requests in flight at once - and the facts are those of a
    one-at-a-time inspection. (How much time that saves is benchmarks/bench_inspect_hub.py's to print.)"""
    from modelfleet.harness.servers import hub_reset, hub_stats

    latency = hub.extra["latency_file"]
    latency.write_text("0.3")
    try:
        hub_reset(hub.url)
        one = inspect_hub(TINY_REPO, revision="v1", endpoint=hub.url, parallel=1)
        assert hub_stats(hub.url)["max_in_flight"] == 1
        hub_reset(hub.url)
        many = inspect_hub(TINY_REPO, revision="v1", endpoint=hub.url, parallel=8)
        assert hub_stats(hub.url)["max_in_flight"] >= 2
    finally:
        latency.unlink()
    assert many["num_shards"] == one["num_shards"] >= 3
    assert {k: v for k, v in many.items() if k != "inspect_seconds"} == {
        k: v for k, v in one.items() if k != "inspect_seconds"}
    with pytest.raises(CheckpointError, match="parallel header reads must be a whole number >= 1, got 0"):
        inspect_hub(TINY_REPO, revision="v1", endpoint=hub.url, parallel=0)
