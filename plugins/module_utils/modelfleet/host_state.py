"""What a host is serving, read from the host itself: modelfleet vLLM units (active or not), the model
each one serves (repo, revision, completeness from the lock file and marker), the models on disk, and the
last benchmark result. Used by the `modelfleet_state` module (status.yml) and `modelfleet status`."""

from __future__ import annotations

import glob
import json
import os
import subprocess

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.fetch import MARKER_DIR
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.systemd import list_units, show
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.vllm_unit import UNIT_GLOB, served_name_of


def model_from_exec_start(exec_start: str) -> str | None:
    """The model directory in a systemd ExecStart property value (`{ path=... ; argv[]=... ; ... }`)."""
    text = exec_start
    if "argv[]=" in text:
        text = text.split("argv[]=", 1)[1].split(" ;", 1)[0]
    argv = text.split()
    if not any("vllm" in a for a in argv):
        return None
    for i, a in enumerate(argv):
        if a == "--model" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--model="):
            return a.split("=", 1)[1]
        if a == "serve" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def read_lock(model_dir: str) -> dict:
    try:
        with open(os.path.join(model_dir, MARKER_DIR, "lock.json")) as f:
            lock = json.load(f)
    except (OSError, ValueError):
        return {"repo_id": None, "revision": None, "complete": False, "total_bytes": None}
    return {"repo_id": lock.get("repo_id"), "revision": lock.get("revision"),
            "total_bytes": lock.get("total_bytes"),
            "complete": os.path.exists(os.path.join(model_dir, MARKER_DIR, "complete"))}


def models_on_disk(root: str) -> list[dict]:
    """<root>/<org>--<name>/<40hex>/ directories with their lock state."""
    out = []
    for d in sorted(glob.glob(os.path.join(root, "*--*", "*"))):
        if os.path.isdir(d) and len(os.path.basename(d)) == 40:
            out.append({"path": d, **read_lock(d)})
    return out


def last_benchmark(bench_dir: str, served_name: str | None = None) -> dict | None:
    files = glob.glob(os.path.join(bench_dir, "*", "*.json"))
    if served_name:
        files = [f for f in files if f.endswith(f"--{served_name}.json")]
    if not files:
        return None
    newest = max(files, key=os.path.getmtime)
    try:
        with open(newest) as f:
            r = json.load(f)
    except (OSError, ValueError):
        return {"path": newest, "error": "unreadable"}
    return {"path": newest, "run_id": (r.get("provenance") or {}).get("run_id"), "date": r.get("date"),
            "headline": r.get("headline"), "knee": (r.get("knee") or {}).get("summary")}


PROPS = ("Id", "ActiveState", "SubState", "ExecStart", "MainPID", "NRestarts", "ActiveEnterTimestamp")


def port_from_exec_start(exec_start: str) -> int | None:
    """The port a vLLM server listens on, from its ExecStart (`--port N` / `--port=N`)."""
    argv = exec_start.split()
    for i, a in enumerate(argv):
        v = argv[i + 1] if a == "--port" and i + 1 < len(argv) else a.split("=", 1)[1] if a.startswith("--port=") \
            else None
        if v is not None:
            return int(v) if v.isdigit() else None
    return None


def units(run=subprocess.run) -> list[dict]:
    """Every modelfleet vLLM unit systemd has loaded (any state), with the model and port its ExecStart names.
    Raises SystemdError when systemd cannot be read."""
    names = sorted({u["unit"] for u in list_units([UNIT_GLOB], run=run)})
    out = []
    for p in show(names, PROPS, run=run):
        name = p.get("Id", "")
        model = model_from_exec_start(p.get("ExecStart", ""))
        entry = {"unit": name, "served_model_name": served_name_of(name), "active": p.get("ActiveState") == "active",
                 "state": f"{p.get('ActiveState')}/{p.get('SubState')}", "main_pid": int(p.get("MainPID") or 0),
                 "restarts": int(p.get("NRestarts") or 0), "since": p.get("ActiveEnterTimestamp") or "",
                 "model_dir": model, "port": port_from_exec_start(p.get("ExecStart", ""))}
        entry.update(read_lock(model) if model else {})
        out.append(entry)
    return out


def host_state(models_root: str, bench_dir: str, run=subprocess.run) -> dict:
    us = units(run)
    serving = [u for u in us if u["active"]]
    return {"units": us, "serving": serving, "models": models_on_disk(models_root),
            "last_benchmark": last_benchmark(bench_dir, serving[0]["served_model_name"] if serving else None)}
