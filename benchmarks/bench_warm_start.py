"""Cold and warm starts of one vLLM server (issue 25): how much of time-to-ready the kept compile caches save.

The tiny model served by real vLLM CPU, with the unit's own cache environment (vllm_unit.cache_environment: every
cache variable pointing into one folder, as the unit's only writable folder). Three starts of the same server
(same vLLM, model and arguments):
  cold      - an empty cache folder (a first deploy);
  restart   - the same folder again (a restart or redeploy on the same host);
  received  - an empty folder that was given only the compile-cache folders (vllm_unit.COMPILE_CACHE_DIRS) of the
              first one: what travels with the model to the next host of the same kind (compile_cache_export.yml).
Each start is timed from the process start to the first completion of one token (the readiness check's request).
The cold start runs --repeat times (a fresh folder each), the warm ones as often.

    python benchmarks/bench_warm_start.py [--repeat 2]

Prints figures; asserts nothing (the goal, warm at most 0.4x cold, belongs here, not in a timed test)."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import (  # noqa: E402
    COMPILE_CACHE_DIRS,
    cache_environment,
)

from modelfleet.harness.servers import start_vllm  # noqa: E402
from modelfleet.harness.tiny_model import build  # noqa: E402


def first_completion(url: str, model: str, timeout: float = 300) -> float:
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 1}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t = time.monotonic()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()
    return time.monotonic() - t


def start(model_dir: Path, cache: Path, logs: Path) -> dict:
    """One start with `cache` as the unit's cache folder: seconds to /v1/models, and to the first completion."""
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    srv = start_vllm(model_dir, "tiny", logs, env=cache_environment(str(cache)))
    try:
        listed = time.monotonic() - t0
        first = first_completion(srv.url, "tiny")
        log = Path(srv.log).read_text(errors="replace")
        return {"listed_s": listed, "ready_s": time.monotonic() - t0, "first_completion_s": first,
                "recompiled": "Compiling model again" in log, "cache_hit_lines": log.count("from the cache")
                + log.count("Directly load the compiled graph")}
    finally:
        srv.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mf-warm-") as tmp:
        tmp = Path(tmp)
        model = tmp / "model"
        build(model)
        runs: dict = {"cold": [], "restart": [], "received": []}
        for i in range(a.repeat):
            first = tmp / f"cache-{i}"
            runs["cold"].append(start(model, first, tmp))
            runs["restart"].append(start(model, first, tmp))
            other = tmp / f"received-{i}"
            other.mkdir()
            for d in COMPILE_CACHE_DIRS:
                if (first / d).is_dir():
                    shutil.copytree(first / d, other / d)
            runs["received"].append(start(model, other, tmp))
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]['ready_s']:.1f} s" for k, v in runs.items()),
                  flush=True)
    cold = statistics.median(r["ready_s"] for r in runs["cold"])
    print(f"\n{'start':<10} {'to /v1/models':>14} {'to 1st token':>13} {'vs cold':>8}  recompiled")
    for k, rs in runs.items():
        ready = statistics.median(r["ready_s"] for r in rs)
        print(f"{k:<10} {statistics.median(r['listed_s'] for r in rs):13.1f}s {ready:12.1f}s {ready / cold:7.2f}x  "
              f"{sum(r['recompiled'] for r in rs)}/{len(rs)}")
    print("\n(medians over", a.repeat, "rounds; goal: warm at most 0.4x cold)")
    print(json.dumps(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
