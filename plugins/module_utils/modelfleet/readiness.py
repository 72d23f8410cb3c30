"""One look at a vLLM server's readiness: /health answers 200, /v1/models lists the served name, and one
real completion comes back. Shared by the `vllm_readiness` module (the start-up wait), the `deploy_record`
module (the unchanged-host check) and the hosts' liveness watchdog (roles/vllm_service/files/modelfleet-watchdog.py,
which runs it with the standard library's HTTP client in place of Ansible's)."""

from __future__ import annotations

import json
import urllib.error

from ansible.module_utils.urls import open_url

# What the start-up wait needs to know about the unit (systemctl show)
UNIT_PROPERTIES = ("ActiveState", "SubState", "NRestarts", "Result", "ExecMainCode", "ExecMainStatus")


def _request(url: str, key: str | None, timeout: float = 5, data: bytes | None = None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    with open_url(url, data=data, headers=headers, timeout=timeout) as r:
        return r.status, r.read()


def look(url: str, name: str, key: str | None, prompt: str = "Hello", max_tokens: int = 4,
         completion_timeout: float = 60):
    """(stage, detail, completion text or None); stage is down, health, listed or ready."""
    url = url.rstrip("/")
    try:
        st, _dummy = _request(url + "/health", key)
        if st != 200:
            return "down", f"/health answered {st}", None
    except (urllib.error.URLError, OSError) as e:
        return "down", f"/health: {getattr(e, 'reason', e)}", None
    try:
        st, body = _request(url + "/v1/models", key)
        models = [m.get("id") for m in json.loads(body).get("data", [])]
    except urllib.error.HTTPError as e:
        return "health", f"/v1/models answered {e.code}", None
    except (urllib.error.URLError, OSError, ValueError) as e:
        return "health", f"/v1/models: {e}", None
    if name not in models:
        return "health", f"/v1/models lists {models}, not {name}", None
    body = json.dumps({"model": name, "prompt": prompt, "max_tokens": max_tokens}).encode()
    try:
        st, out = _request(url + "/v1/completions", key, timeout=completion_timeout, data=body)
        text = json.loads(out)["choices"][0]["text"]
    except urllib.error.HTTPError as e:
        return "listed", f"completion answered {e.code}: {e.read()[:200]!r}", None
    except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
        return "listed", f"completion: {e}", None
    return "ready", "health 200, model listed, completion returned", text


def restart_count(props: dict) -> int:
    """systemd's NRestarts from systemd.show_unit's answer (0 when absent or unreadable)."""
    v = props.get("NRestarts") or "0"
    return int(v) if v.isdigit() else 0


def start_verdict(props: dict, restarts_allowed: int = 0) -> tuple[bool, str]:
    """Whether a server that was just started (explicitly, so systemd's NRestarts counts from 0) has died
    before it was ever ready: its unit failed, or its process exited and systemd restarted it (or is about
    to) more often than allowed. Waiting on after that only repeats the same failure until the start limit
    is spent: on a GPU host that is one more weight load per restart before the rollback. A negative
    restarts_allowed judges only the failed state (a unit this run did not start)."""
    state, sub = props.get("ActiveState", ""), props.get("SubState", "")
    restarts = restart_count(props)
    status = props.get("ExecMainStatus") or "?"
    # ExecMainCode is the si_code of the last exit: 1 exited, 2 killed, 3 dumped core; 0 none yet (restarted)
    how = {"1": f"exit status {status}", "2": f"killed by signal {status}",
           "3": f"killed by signal {status}, core dumped"}.get(props.get("ExecMainCode") or "", "exit not recorded")
    if state == "failed":
        return True, f"the unit failed ({props.get('Result') or 'failed'}, {how})"
    if restarts_allowed < 0:  # the unit was not started by this run: its restart count is older history
        return False, ""
    pending = 1 if sub == "auto-restart" else 0
    if restarts + pending > restarts_allowed:
        return True, (f"the server exited before it was ready ({how}) and systemd restarted it "
                      f"{restarts + pending} time(s); allowed before ready: {restarts_allowed}")
    return False, ""


def in_flight(url: str, key: str | None = None, timeout: float = 5) -> int | None:
    """The requests a server holds now - running plus waiting, from vLLM's own gauges on /metrics; None when the
    server does not answer or exposes neither gauge (nothing to wait for)."""
    from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.bench import server_snapshot

    try:
        _dummy, body = _request(url.rstrip("/") + "/metrics", key, timeout=timeout)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    snap = server_snapshot(body.decode("utf-8", "replace"))
    if snap["requests_running"] is None and snap["requests_waiting"] is None:
        return None
    return int((snap["requests_running"] or 0) + (snap["requests_waiting"] or 0))
