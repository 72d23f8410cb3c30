"""First deploy vs an unchanged second deploy on the built-in local fleet: wall time, and the first run's
wall time without the download and the install (issue goal: second <= 25% of that).

    python benchmarks/bench_rerun.py [--profile tiny-llama] [--keep-fleet] [--hub-latency 0.1]

Recreates the three local containers (scripts/fleet.sh down/up) unless --keep-fleet, starts the local hub
server, runs deploy_kimi_int4.yml's flow twice through the runner wrapper and prints the figures. The
download and install time is the union of every host's fetch and environment phase spans, read from the
first run's events (hosts fetching in parallel count once). --hub-latency: every hub request waits that long
first (a far-away hub: the preflight's inspection and the revision's resolution pay it on every run)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from modelfleet import runner  # noqa: E402

INVENTORY = str(ROOT / "inventory" / "local" / "local.fleet.yml")
EXCLUDED = {"fetch", "environment"}


def deploy(profile: str, hub: str) -> tuple[runner.RunResult, float]:
    res = runner.deploy(profile, inventory=INVENTORY, playbook="deploy_kimi_int4.yml",
                        extravars={"hf_fetch_endpoint": hub})
    events = [json.loads(line) for line in Path(res.run_dir, "events.jsonl").open()]
    return res, runner.wall_seconds_in(runner.phase_spans(events), EXCLUDED)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny-llama")
    ap.add_argument("--keep-fleet", action="store_true", help="do not recreate the containers first")
    ap.add_argument("--hub-latency", type=float, default=0.0, help="seconds each hub request waits first")
    a = ap.parse_args()
    os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
    os.environ.setdefault("MODELFLEET_STATE_DIR", str(ROOT / ".cache" / "state"))
    if not a.keep_fleet:
        subprocess.run([str(ROOT / "scripts" / "fleet.sh"), "down"], check=True)
    subprocess.run([str(ROOT / "scripts" / "fleet.sh"), "up"], check=True, stdout=subprocess.DEVNULL)
    hubctl = [sys.executable, "-m", "modelfleet.harness.hubctl", "start", str(ROOT / ".cache" / "demo-hub")]
    # a hub started by an older checkout may not read the latency file: start it afresh
    subprocess.run([*hubctl[:-2], "stop", hubctl[-1]], check=True)
    out = subprocess.run(hubctl, check=True, capture_output=True, text=True).stdout
    hub = json.loads(out)["url"]
    latency_file = ROOT / ".cache" / "demo-hub" / "hub-latency"
    if a.hub_latency > 0:
        latency_file.write_text(str(a.hub_latency))
        print(f"the hub adds {a.hub_latency * 1000:.0f} ms to every request")
    else:
        latency_file.unlink(missing_ok=True)
    rows = []
    for label in ("first", "second"):
        res, excluded = deploy(a.profile, hub)
        changed = sum(h.changed for h in res.hosts.values())
        rows.append((label, res, excluded, changed))
        print(f"{label} run: {res.duration_s:.1f} s, rc {res.rc}, {changed} changed, fetch+environment "
              f"{excluded:.1f} s ({res.run_dir})", flush=True)
        if not res.ok:
            print(f"{label} run failed: " + "; ".join(f"{n}: {h.failure[:200]}" for n, h in res.hosts.items()
                                                      if h.failure), file=sys.stderr)
            return 1
    (_, first, first_excl, _), (_, second, _, second_changed) = rows
    base = first.duration_s - first_excl
    print(f"\nfirst run                              {first.duration_s:8.1f} s")
    print(f"  of which download + install          {first_excl:8.1f} s")
    print(f"  without them                         {base:8.1f} s")
    print(f"second run (unchanged)                 {second.duration_s:8.1f} s, {second_changed} changed tasks")
    print(f"second / first without download+install {second.duration_s / base:7.2f}  (goal <= 0.25)")
    print(f"second / first                         {second.duration_s / first.duration_s:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
