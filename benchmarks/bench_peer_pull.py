"""One hop of peer distribution (issue 23): a pull whose files move in one rsync session and are hashed while the
next one moves, against the same pull with one session per file, each begun after the file before it was hashed
(the code before 2026-12-07), on the same files, interleaved.

    python benchmarks/bench_peer_pull.py [--files 8] [--file-mb 128] [--rate-mbyte 0 300] [--repeat 3]

The source is a local folder and the transfer the real rsync (no SSH: the link is emulated with rsync's own
--bwlimit, 0 for none), so the figure is the hop's own work: transfer, sha256 against the lock, rename. Printed
per rate: the median pull time of each way, the sum of the transfers and the sum of the hashes measured inside the
pulls, and the time the files would take at the rate alone. On a hop whose hash is as slow as its link (100 GbE
against sha256 at ~1.5 GB/s per core) the serial pull takes about twice the overlapped one; on this 2-core machine
the rsync processes and the hash share the cores, which bounds what can be shown here. Asserts nothing."""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet import peer  # noqa: E402
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import (  # noqa: E402
    build_lock,
    finalize,
    model_paths,
)

REPO, COMMIT = "bench/peer-pull", "0" * 40


def make_origin(work: Path, files: int, file_mb: int) -> tuple[str, dict]:
    root = str(work / "origin")
    staging = model_paths(root, REPO, COMMIT)["staging"]
    os.makedirs(staging)
    entries = []
    for i in range(files):
        name = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        h = hashlib.sha256()
        with open(os.path.join(staging, name), "wb") as f:
            for _ in range(file_mb):
                b = os.urandom(1 << 20)
                h.update(b)
                f.write(b)
        entries.append({"name": name, "size": file_mb << 20, "sha256": h.hexdigest()})
    lock = build_lock(REPO, "main", COMMIT, entries, [], "http://hub")
    finalize(staging, model_paths(root, REPO, COMMIT)["final"], lock)
    return root, lock


def one_pull(origin: str, lock: dict, dest: str, rate_mbyte: int, serial: bool) -> dict:
    """A pull into an empty `dest`; `serial` moves each file in a session of its own, begun once the file before
    it was hashed and kept (the pull before the change), through the pull's own hooks."""
    shutil.rmtree(dest, ignore_errors=True)
    moved, hashed = [], []
    kept = threading.Event()
    kept.set()

    def one(cmd, timeout, **kw):
        if rate_mbyte:
            cmd = [cmd[0], f"--bwlimit={rate_mbyte * 1000 * 1000 // 1024}", *cmd[1:]]
        t = time.monotonic()
        r = peer.run_rsync(cmd, timeout, **kw)
        moved.append(time.monotonic() - t)
        return r

    def rsync(cmd, timeout, **kw):
        arg = next((x for x in cmd if x.startswith("--files-from=")), None)
        if not serial or arg is None:
            return one(cmd, timeout, **kw)
        # the pull before the change: one session per file, each after the file before it was hashed and kept
        lst = arg.split("=", 1)[1]
        for name in [n for n in open(lst, "rb").read().split(b"\0") if n]:
            open(os.path.join(cmd[-1], name.decode()), "ab").close()  # begun: the file before is whole, to be hashed
            kw["on_line"](name.decode())
            kept.wait()
            time.sleep(0.005)  # the hashing thread renames and writes the status right after its hash returns
            kept.clear()
            with open(lst + ".one", "wb") as f:
                f.write(name + b"\0")
            rc, err = one([x if x != arg else f"--files-from={lst}.one" for x in cmd], timeout, **kw)
            if rc != 0:
                return rc, err
        return 0, ""

    def digest(path, algo):
        t = time.monotonic()
        r = peer.file_digest(path, algo)
        hashed.append(time.monotonic() - t)
        kept.set()
        return r

    t = time.monotonic()
    res = peer.pull(root=dest, lock=lock, sources=[{"host": "o", "address": "", "root": origin, "complete": True}],
                    poll_seconds=0.02, rsync=rsync, digest=digest)
    wall = time.monotonic() - t
    assert res["dropped"] == [] and res["bytes_moved"] == lock["total_bytes"]
    return {"wall": wall, "moving": sum(moved), "hashing": sum(hashed)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--file-mb", type=int, default=128)
    ap.add_argument("--rate-mbyte", type=int, nargs="+", default=[0, 300], help="rsync --bwlimit in MB/s; 0: none")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mf-bench-peer-pull-", dir="/var/tmp"))
    try:
        origin, lock = make_origin(work, a.files, a.file_mb)
        total = lock["total_bytes"]
        print(f"{a.files} files of {a.file_mb} MiB ({total / 1e6:.0f} MB), one hop from a local folder with rsync; "
              f"{os.cpu_count()} cores; medians of {a.repeat} runs, the two ways interleaved")
        for rate in a.rate_mbyte:
            runs: dict = {"serial": [], "overlapped": []}
            for i in range(a.repeat):
                for way in (("serial", "overlapped") if i % 2 == 0 else ("overlapped", "serial")):
                    runs[way].append(one_pull(origin, lock, str(work / "dest"), rate, way == "serial"))
            limit = f", {total / (rate * 1e6):.2f} s at the rate alone" if rate else ""
            print(f"rate {'unlimited' if not rate else f'{rate} MB/s'}{limit}:")
            med = {way: {k: statistics.median(r[k] for r in rs) for k in ("wall", "moving", "hashing")}
                   for way, rs in runs.items()}
            for way, m in med.items():
                print(f"  {way:<10} pull {m['wall']:6.2f} s ({total / m['wall'] / 1e6:6.0f} MB/s); transfers "
                      f"{m['moving']:6.2f} s, hashes {m['hashing']:5.2f} s")
            print(f"  overlapped / serial: {med['overlapped']['wall'] / med['serial']['wall']:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
