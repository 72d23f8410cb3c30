"""modelfleet's liveness watchdog on a host (run by modelfleet-watchdog.service every interval): for each served
unit described in the folder given (default /etc/modelfleet/watchdog), one real 1-token completion; failures in a
row restart the unit. The rule and the glue are the collection's own module_utils (watchdog.py, readiness.py),
copied beside this file by the vllm_service role; this host has no Ansible, so readiness's HTTP calls go through
the standard library's urlopen."""

import json
import os
import sys
import types
import urllib.request


def _open_url(url, data=None, headers=None, timeout=10):
    return urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers or {}), timeout=timeout)


def _standalone() -> None:
    """Make readiness.py importable without Ansible: its one Ansible import, open_url, is urlopen here."""
    if "ansible.module_utils.urls" in sys.modules:
        return
    names = ("ansible", "ansible.module_utils", "ansible.module_utils.urls")
    mods = {n: types.ModuleType(n) for n in names}
    mods["ansible.module_utils.urls"].open_url = _open_url
    sys.modules.update(mods)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv) -> int:
    _standalone()
    import readiness
    import watchdog

    conf_dir = argv[1] if len(argv) > 1 else "/etc/modelfleet/watchdog"
    state_dir = os.environ.get("STATE_DIRECTORY", watchdog.STATE_DIR).split(":")[0]
    os.makedirs(state_dir, exist_ok=True)
    try:
        names = sorted(n for n in os.listdir(conf_dir) if n.endswith(".json"))
    except FileNotFoundError:
        names = []
    rc = 0
    for name in names:
        try:
            with open(os.path.join(conf_dir, name)) as f:
                cfg = json.load(f)
            watchdog.check(cfg, state_dir, readiness.look, lambda msg: print(msg, flush=True))
        except (OSError, KeyError, TypeError, ValueError, AttributeError) as e:
            print(f"{name}: not a watchdog description ({type(e).__name__}: {e}); rewrite it with the vllm_service "
                  "role", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
