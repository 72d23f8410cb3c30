"""Where the checkout's parts are, for code that runs from the installed package (editable install).

modelfleet's pure logic lives in plugins/module_utils/modelfleet so Ansible ships it to hosts with the
modules; the CLI and tests import the very same files as `ansible.module_utils.modelfleet.*` by adding
that folder to the `ansible.module_utils` package path."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(os.environ.get("MODELFLEET_REPO") or Path(__file__).resolve().parents[2])
MODULE_UTILS = REPO_ROOT / "plugins" / "module_utils"
PROFILES_DIR = REPO_ROOT / "profiles"
PLAYBOOKS_DIR = REPO_ROOT / "playbooks"


def import_module_utils() -> None:
    import ansible.module_utils as mu

    p = str(MODULE_UTILS)
    if p not in list(mu.__path__):
        mu.__path__.append(p)
