"""Fetch throughput: hf_snapshot (the module the hf_fetch role runs, through Ansible) vs a bare
huggingface_hub snapshot_download of the same repo from the same local hub; sha256 verification MB/s.

    python benchmarks/bench_fetch.py [--mib 96] [--files 4]

Builds a repo of FILES random shards (MIB in all) plus the tiny model, serves it from the local hub
server (olah), and prints figures. Hub egress for 1 vs N hosts with fan-out is measured by the
molecule 'fetch' scenario (tests/test_fetch.py::test_hub_served_one_copy)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from modelfleet._paths import import_module_utils  # noqa: E402

import_module_utils()
from ansible.module_utils.modelfleet.fetch import file_digest  # noqa: E402

from modelfleet.harness.hub_repo import publish  # noqa: E402
from modelfleet.harness.servers import hub_reset, hub_stats, start_hub  # noqa: E402
from modelfleet.harness.tiny_model import build  # noqa: E402

REPO = "modelfleet-bench/bulk"


def module(name, args):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    r = subprocess.run(["ansible", "localhost", "-c", "local", "-i", "localhost,", "-m", name, "-a", json.dumps(args),
                        "-e", f"ansible_python_interpreter={sys.executable}"], capture_output=True, text=True,
                       cwd=ROOT, env=env)
    res = json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    if r.returncode:
        raise SystemExit(res.get("msg"))
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=96)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-fetch-"))
    try:
        model = work / "model"
        build(model, seed=3, shards=2)
        per = a.mib * 2**20 // a.files
        for i in range(a.files):
            with open(model / f"bulk-{i:02d}.safetensors", "wb") as f:
                f.write(os.urandom(per))
        publish(model, work / "mirrors", REPO)
        hub = start_hub(work / "mirrors", work)
        try:
            from huggingface_hub import snapshot_download

            total = sum(p.stat().st_size for p in model.iterdir() if p.is_file())
            t = time.perf_counter()
            snapshot_download(REPO, revision="main", local_dir=work / "bare", endpoint=hub.url, max_workers=a.workers)
            bare = time.perf_counter() - t
            bare_served = hub_stats(hub.url)["bytes_served"]
            hub_reset(hub.url)
            lock = module("hf_lock", {"repo_id": REPO, "revision": "main", "endpoint": hub.url,
                                      "root": str(work / "models")})["lock"]
            t = time.perf_counter()
            res = module("hf_snapshot", {"root": str(work / "models"), "lock": lock, "endpoint": hub.url,
                                         "max_workers": a.workers})
            role_wall = time.perf_counter() - t
            served = hub_stats(hub.url)["bytes_served"]
        finally:
            hub.stop()
        dl = res["download"]["seconds"]
        print(f"repo: {total / 1e6:.1f} MB in {len(lock['files'])} files, max_workers={a.workers}")
        print(f"bare snapshot_download: {bare:.2f} s = {total / bare / 1e6:.1f} MB/s (hub served {bare_served} B)")
        print(f"hf_snapshot download phase: {dl:.2f} s = {total / dl / 1e6:.1f} MB/s "
              f"-> {bare / dl:.2f}x the bare client's throughput (goal >= 0.95x)")
        print(f"hf_snapshot whole module (ansible start-up, download, verify, move): {role_wall:.2f} s; "
              f"hub served {served} B ({'one copy' if served == lock['total_bytes'] else 'NOT one copy'} of "
              f"{lock['total_bytes']} B)")
        print(f"sha256 verification inside the module: {res['verify']['mb_per_s']} MB/s")
        big = max(model.glob("bulk-*.safetensors"), key=lambda p: p.stat().st_size)
        t = time.perf_counter()
        file_digest(str(big), "sha256")
        print(f"sha256 of one {big.stat().st_size / 1e6:.0f} MB file (warm cache): "
              f"{big.stat().st_size / (time.perf_counter() - t) / 1e6:.0f} MB/s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
