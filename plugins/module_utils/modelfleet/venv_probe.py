"""What a Python virtualenv holds, asked of its own interpreter, and whether that is already what a role pins
(one probe for nvidia_env's vLLM venv and hf_fetch's fetch venv). Pure except `probe`, which runs the venv's
python."""

from __future__ import annotations

import json
import re
import subprocess

# runs inside the venv: the installed version of each name (None when absent), by normalised name
PROBE_CODE = (
    "import importlib.metadata as m, json, re, sys\n"
    "norm = lambda n: re.sub(r'[-_.]+', '-', n).lower()\n"
    "have = {norm(d.metadata['Name']): d.version for d in m.distributions() if d.metadata['Name']}\n"
    "print(json.dumps({n: have.get(norm(n)) for n in sys.argv[1:]}))\n"
)
PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s,;=<>!~]+)\s*\Z")


def pin_name(spec: str) -> str:
    return re.split(r"[\s\[<>=!~;,]", spec.strip(), maxsplit=1)[0]


def judge(installed: dict | None, pins: list[str], absent: list[str]) -> tuple[bool, list[str]]:
    """(current, reasons): current only when the venv answered, every pin is an exact name==version that is
    installed at that version, and no name in `absent` is installed. A pin in another form (>=, extras) is
    never taken as current: pip decides."""
    if installed is None:
        return False, ["the venv's python did not answer (no venv yet)"]
    reasons = []
    for spec in pins:
        m = PIN.match(spec)
        if not m:
            reasons.append(f"{spec} is not an exact name==version pin")
            continue
        have = installed.get(m.group(1))
        if have != m.group(2):
            reasons.append(f"{m.group(1)} is {have or 'not installed'}, pinned {m.group(2)}")
    for name in absent:
        if installed.get(name):
            reasons.append(f"{name} {installed[name]} is installed and must not be")
    return not reasons, reasons


def probe(python: str, names: list[str], timeout: float = 120) -> dict | None:
    """{name: version or None} from the venv's own python, or None when it cannot answer."""
    try:
        out = subprocess.run([python, "-c", PROBE_CODE, *names], capture_output=True, text=True, timeout=timeout,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        data = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return data if isinstance(data, dict) else None
