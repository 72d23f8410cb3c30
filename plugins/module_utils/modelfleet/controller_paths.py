"""Where modelfleet keeps its state on the controller, in one place: the runner (run folders), the benchmark
role (reports) and vllm_service (compile-cache archives) all ask this function, the playbooks through the
`state_dir` lookup."""

from __future__ import annotations

import os


def state_dir(environ=None, home: str | None = None) -> str:
    """$MODELFLEET_STATE_DIR, else ~/.local/state/modelfleet (XDG's state folder for this user)."""
    environ = os.environ if environ is None else environ
    explicit = environ.get("MODELFLEET_STATE_DIR")
    if explicit:
        return explicit
    return os.path.join(home or environ.get("HOME") or os.path.expanduser("~"), ".local", "state", "modelfleet")
