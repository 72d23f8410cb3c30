"""Header-only inspection of a shape-faithful Kimi-K2.5 INT4 checkpoint (64 sparse shards, ~595 GB
apparent): bytes read vs header bytes, and time vs safetensors.safe_open over the same files.

    python benchmarks/bench_inspect.py [--dir DIR] [--repeat N]

Prints figures; asserts nothing (targets belong here, not in timed tests)."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.checkpoint import inspect_local  # noqa: E402
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.sizes import fmt_bytes  # noqa: E402

from modelfleet.harness.synthetic import write_checkpoint  # noqa: E402

CK = ROOT / "tests" / "fixtures" / "checkpoints"


def counted_inspect(path: str) -> tuple[dict, int]:
    """inspect_local with every byte read from a shard counted (shards are opened as descriptors, os.fdopen; the
    count is shared with the worker processes that read shards in parallel)."""
    import multiprocessing
    import os

    total = multiprocessing.Value("q", 0)
    real_fdopen = os.fdopen

    def counted(fd, mode="r", *a, **k):
        f = real_fdopen(fd, mode, *a, **k)
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".safetensors"):
            orig = f.read

            def read(n=-1):
                b = orig(n)
                with total.get_lock():
                    total.value += len(b)
                return b

            f.read = read
        return f

    os.fdopen = counted
    try:
        return inspect_local(path), total.value
    finally:
        os.fdopen = real_fdopen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    tmp = None
    if a.dir:
        d = Path(a.dir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="kimi-synthetic-")
        d = Path(tmp.name)
        t = time.perf_counter()
        info = write_checkpoint(CK / "kimi-k2.5-tensor-inventory.md", CK / "kimi-k2.5-config.json", d)
        print(f"built synthetic checkpoint: {info['shards']} shards, {info['tensors']} tensors, "
              f"{fmt_bytes(info['tensor_bytes'])} of tensors in {time.perf_counter() - t:.2f} s")
    facts, nread = counted_inspect(str(d))
    header_bytes = facts["shard_bytes"] - facts["tensor_bytes"]
    print(f"apparent size {fmt_bytes(facts['shard_bytes'])}; header bytes {header_bytes}; "
          f"bytes read by inspect_local from shards {nread} ({'= headers only' if nread == header_bytes else 'MORE'})")
    times = []
    for _ in range(a.repeat):
        t = time.perf_counter()
        inspect_local(str(d))
        times.append(time.perf_counter() - t)
    print(f"inspect_local (64 headers + index + config, full validation and counts): "
          f"median {statistics.median(times):.3f} s, min {min(times):.3f} s over {a.repeat}")
    try:
        from safetensors import safe_open
    except ImportError:
        print("safetensors not installed: skipping the safe_open comparison")
        return 0
    shards = sorted(d.glob("*.safetensors"))
    times = []
    for _ in range(a.repeat):
        t = time.perf_counter()
        n = 0
        for s in shards:
            with safe_open(str(s), framework="numpy") as f:
                n += len(list(f.keys()))
        times.append(time.perf_counter() - t)
    print(f"safetensors.safe_open over the same {len(shards)} files (open + list {n} keys): "
          f"median {statistics.median(times):.3f} s, min {min(times):.3f} s")
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
