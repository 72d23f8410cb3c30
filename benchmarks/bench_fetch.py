"""Fetch throughput: hf_snapshot (the module the hf_fetch role runs, through Ansible) vs a bare
huggingface_hub snapshot_download of the same repo from the same local hub; sha256 verification MB/s.

    python benchmarks/bench_fetch.py [--mib 96] [--files 4] [--fleet]

Builds a repo of FILES random shards (MIB in all) plus the tiny model, serves it from the local hub
server (olah), and prints figures. With --fleet it also runs the hf_fetch role on the built-in local fleet
(scripts/fleet.sh up: three containers): into one host, then into all three with fan-out from the seed,
and prints the hub's bytes served for each (goal: equal)."""

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
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import file_digest  # noqa: E402

from modelfleet.harness.hub_repo import publish  # noqa: E402
from modelfleet.harness.servers import hub_reset, hub_stats, start_hub  # noqa: E402
from modelfleet.harness.tiny_model import build  # noqa: E402

REPO = "modelfleet-bench/bulk"
FLEET_ROOT = "/models-bench"
FLEET_PLAYBOOK = """
- name: Fetch the benchmark repo with hf_fetch
  hosts: gpu_hosts
  gather_facts: false
  tasks:
    - name: Run hf_fetch
      ansible.builtin.include_role:
        name: modelfleet.fleet.hf_fetch
      vars:
        hf_fetch_repo_id: %s
        hf_fetch_root: %s
        hf_fetch_endpoint: "{{ bench_hub }}"
        hf_fetch_relay_dir: "{{ bench_relay }}"
"""


def fleet_egress(hub_url: str, work: Path, hosts: list[str]) -> list[tuple[int, int, float]]:
    """(hosts, hub bytes served, seconds) for a fetch into the first host alone, then into all of them."""
    inventory = ROOT / "inventory" / "local" / "local.fleet.yml"
    subprocess.run([str(ROOT / "scripts" / "fleet.sh"), "up"], check=True, stdout=subprocess.DEVNULL)
    pb = work / "fleet-fetch.yml"
    pb.write_text(FLEET_PLAYBOOK % (REPO, FLEET_ROOT))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    rows = []
    for subset in (hosts[:1], hosts):
        for h in hosts:
            subprocess.run(["podman", "exec", h, "rm", "-rf", FLEET_ROOT], check=True)
        shutil.rmtree(work / "relay", ignore_errors=True)
        hub_reset(hub_url)
        t = time.perf_counter()
        r = subprocess.run(["ansible-playbook", "-i", str(inventory), "--limit", ",".join(subset), str(pb),
                            "-e", f"bench_hub={hub_url}", "-e", f"bench_relay={work / 'relay'}",
                            "-e", f"hf_fetch_wheelhouse={ROOT / '.cache' / 'wheelhouse' / 'fetch'}"],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if r.returncode:
            raise SystemExit(f"hf_fetch on {subset} failed:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
        rows.append((len(subset), hub_stats(hub_url)["bytes_served"], wall))
    for h in hosts:
        subprocess.run(["podman", "exec", h, "rm", "-rf", FLEET_ROOT], check=True)
    return rows


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
    ap.add_argument("--fleet", action="store_true", help="also measure hub egress for 1 vs 3 hosts (local fleet)")
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
            fleet = fleet_egress(hub.url, work, ["mf-node-1", "mf-node-2", "mf-node-3"]) if a.fleet else []
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
        for n, b, wall in fleet:
            print(f"hf_fetch role into {n} host(s) of the local fleet: hub served {b} B "
                  f"({b / lock['total_bytes']:.2f} copies of {lock['total_bytes']} B), {wall:.1f} s")
        if fleet:
            (_, one, _), (n, many, _) = fleet
            print(f"hub egress {n} hosts / 1 host: {many / one:.3f} (goal: 1.000)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
