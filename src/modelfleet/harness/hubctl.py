"""Start or stop a detached local hub server holding the tiny test models, for molecule scenarios and
the local fleet demo (pytest uses the fixture in tests/conftest.py instead).

    python -m modelfleet.harness.hubctl start STATE_DIR [--port N]   -> prints JSON {url, pid, repos}
    python -m modelfleet.harness.hubctl stop STATE_DIR

The server process is started in its own session and ended by the PID recorded in STATE_DIR."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

REPOS = {"modelfleet-test/tiny-llama": {"seed": 0, "shards": 3, "name": "tiny-llama"},
         "modelfleet-test/tiny-llama-b": {"seed": 1, "shards": 2, "name": "tiny-llama-b"}}


def start(state: Path, port: int) -> dict:
    from modelfleet.harness.hub_repo import publish
    from modelfleet.harness.servers import HUB_VENV, free_port, wait_http
    from modelfleet.harness.tiny_model import build

    state.mkdir(parents=True, exist_ok=True)
    info_file = state / "hub.json"
    if info_file.exists():
        info = json.loads(info_file.read_text())
        try:
            os.kill(info["pid"], 0)
            wait_http(info["url"] + "/_modelfleet/stats", 5, what="local hub server")
            return info
        except (OSError, RuntimeError):
            info_file.unlink()
    repos = {}
    for repo_id, spec in REPOS.items():
        model = state / "models" / spec["name"]
        build(model, seed=spec["seed"], shards=spec["shards"], name=spec["name"])
        repos[repo_id] = publish(model, state / "mirrors", repo_id)
    port = port or free_port()
    log = state / "hub.log"
    import subprocess

    py = HUB_VENV / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"the local hub venv is missing ({HUB_VENV}); run scripts/setup.sh --hub")
    cmd = [str(py), str(Path(__file__).with_name("hub_server.py")), "--mirrors", str(state / "mirrors"),
           "--port", str(port), "--fail-file", str(state / "hub-down"), "--rate-file", str(state / "hub-rate"),
           "--stall-file", str(state / "hub-stall"), "--latency-file", str(state / "hub-latency")]
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/_modelfleet/stats", 30, proc, log, "local hub server")
    info = {"url": url, "pid": proc.pid, "port": port, "state": str(state), "repos": repos, "started_at": time.time()}
    info_file.write_text(json.dumps(info, indent=1))
    return info


def stop(state: Path) -> None:
    info_file = state / "hub.json"
    if not info_file.exists():
        return
    info = json.loads(info_file.read_text())
    try:
        os.killpg(info["pid"], signal.SIGTERM)
        for _ in range(50):
            os.kill(info["pid"], 0)
            time.sleep(0.1)
        os.killpg(info["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass
    info_file.unlink()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("action", choices=["start", "stop"])
    ap.add_argument("state")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args(argv)
    if a.action == "start":
        print(json.dumps(start(Path(a.state), a.port)))
    else:
        stop(Path(a.state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
