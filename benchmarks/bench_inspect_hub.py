"""The controller's preflight against a far-away hub (issue 23): header-only inspection of a many-shard repo on
the local hub server with a fixed latency per request, the shard headers read one at a time and several at once.

    python benchmarks/bench_inspect_hub.py [--shards 32] [--latency 0.1] [--parallel 1 16]
    python benchmarks/bench_inspect_hub.py --kimi [--latency 0.1]    the 64-shard Kimi-K2.5 INT4 layout:
        shape-faithful headers (~330 KB each) of sparse shards (595 GB apparent); the hub holds the
        headers and serves the real sizes

Prints figures; asserts nothing (targets belong here, not in timed tests)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.checkpoint import inspect_hub  # noqa: E402

from modelfleet.harness.hub_repo import publish  # noqa: E402
from modelfleet.harness.servers import hub_reset, hub_stats, start_hub  # noqa: E402
from modelfleet.harness.synthetic import write_checkpoint  # noqa: E402
from modelfleet.harness.tiny_model import build  # noqa: E402

CK = ROOT / "tests" / "fixtures" / "checkpoints"


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU seconds of a process so far (the hub server's shows whether it, not the client, is the
    floor)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--latency", type=float, default=0.1, help="seconds the hub waits before each request")
    ap.add_argument("--parallel", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--kimi", action="store_true", help="the Kimi-K2.5 INT4 layout (64 shards, real-size headers)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mf-bench-inspect-hub-"))
    if a.kimi:
        info = write_checkpoint(CK / "kimi-k2.5-tensor-inventory.md", CK / "kimi-k2.5-config.json", work / "model")
        heads = [int.from_bytes(open(p, "rb").read(8), "little") + 8 for p in (work / "model").glob("*.safetensors")]
        lo, hi = min(heads) / 1e3, max(heads) / 1e3
        print(f"Kimi-K2.5 INT4 layout: {info['shards']} shards, headers {lo:.0f}-{hi:.0f} KB "
              f"(mean {sum(heads) / len(heads) / 1e3:.0f} KB)")
        publish(work / "model", work / "mirrors", "bench/tiny-many", sparse_head=max(heads) + 4096)
    else:
        build(work / "model", seed=0, shards=a.shards, name="tiny-many")
        publish(work / "model", work / "mirrors", "bench/tiny-many")
    latency = work / "latency"
    srv = start_hub(work / "mirrors", work, latency_file=str(latency))
    try:
        # warm: the hub server's caches (olah's, and the harness layer's for reads at a commit)
        facts0 = inspect_hub("bench/tiny-many", endpoint=srv.url)
        latency.write_text(str(a.latency))
        print(f"{facts0['num_shards']} shards, {a.latency * 1000:.0f} ms per request on the hub")
        for n in a.parallel:
            hub_reset(srv.url)
            hub0, me0, t = cpu_seconds(srv.proc.pid), cpu_seconds(), time.monotonic()
            facts = inspect_hub("bench/tiny-many", endpoint=srv.url, parallel=n)
            dt = time.monotonic() - t
            hub_cpu, my_cpu = cpu_seconds(srv.proc.pid) - hub0, cpu_seconds() - me0
            st = hub_stats(srv.url)
            print(f"  header reads at once {n:>2}: {dt:6.2f} s, {st['requests']} requests, at most "
                  f"{st['max_in_flight']} in flight, {facts['num_shards']} shards read; CPU: client {my_cpu:.2f} s, "
                  f"hub server {hub_cpu:.2f} s")
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
