"""The one way modelfleet asks systemd about services (issue 21): list them, and show their properties,
through systemctl. Used by disk planning (in_use: what live units reference), the host's state (status),
the deploy record (which units are active) and readiness (a starting unit's state). `run` is subprocess.run
on a host; tests pass a fake that answers like systemctl. A systemctl that cannot run or fails raises
SystemdError naming the command and its error, never an empty answer that reads as "nothing runs"."""

from __future__ import annotations

import subprocess

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.errors import ModelfleetError


class SystemdError(ModelfleetError):
    """systemctl could not be run, or failed; the message is the command's own error."""


def _systemctl(argv: list[str], run) -> str:
    try:
        r = run(argv, capture_output=True, text=True)
    except OSError as e:
        raise SystemdError(str(e)) from None
    if r.returncode != 0:
        raise SystemdError(f"systemctl {argv[1]} exited {r.returncode}: {(r.stderr or r.stdout or '').strip()[:200]}")
    return r.stdout or ""


def list_units(patterns=(), state: str = "all", run=subprocess.run) -> list[dict]:
    """The services systemd has loaded, in its order, as [{unit, load, active, sub}]: every state ("all",
    which includes a unit waiting to restart: active "activating", sub "auto-restart"), or only those in
    `state` (e.g. "active"); `patterns` are unit globs such as modelfleet-vllm@*.service."""
    argv = ["systemctl", "list-units", "--type=service", "--all" if state == "all" else f"--state={state}",
            "--no-legend", "--plain", "--no-pager", *patterns]
    out = []
    for line in _systemctl(argv, run).splitlines():
        cols = line.split()
        # UNIT LOAD ACTIVE SUB [DESCRIPTION]
        if len(cols) >= 4 and cols[0].endswith(".service"):
            out.append({"unit": cols[0], "load": cols[1], "active": cols[2], "sub": cols[3]})
    return out


def parse_show(text: str) -> list[dict]:
    """`systemctl show -p ... A B C` output: one block of Key=Value lines per unit, blank-line separated; a key
    that repeats (Environment=, ExecStartPre=) keeps every value, one per line."""
    units, cur = [], {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                units.append(cur)
                cur = {}
            continue
        k, sep, v = line.partition("=")
        if not sep:
            continue
        cur[k] = (cur[k] + "\n" + v) if k in cur else v
    if cur:
        units.append(cur)
    return units


def show(units: list[str], props, run=subprocess.run) -> list[dict]:
    """The properties asked of each unit, one {property: value} per unit in the order given (systemctl's own
    order); an empty list of units asks nothing."""
    if not units:
        return []
    argv = ["systemctl", "show", "--no-pager", "-p", ",".join(props), *units]
    return [{k: v for k, v in u.items() if k in props} for u in parse_show(_systemctl(argv, run))]


def show_unit(unit: str, props, run=subprocess.run) -> dict:
    """The properties asked of one unit ({} for a unit systemd does not know: it answers with defaults)."""
    found = show([unit], props, run)
    return found[0] if found else {}
