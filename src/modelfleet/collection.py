"""Where the Ansible collection modelfleet.fleet is, for the CLI, the runner and the harness.

The collection is an ordinary Python package, `ansible_collections.modelfleet.fleet`: a wheel installs it into
site-packages (ansible-core finds collections there by scanning sys.path), an editable install maps it onto the
checkout (pyproject.toml). So the CLI imports the collection's module_utils by their real names and finds the
playbooks, profiles and ansible.cfg beside them, with no path added at run time.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

NAME = "modelfleet.fleet"
PACKAGE = "ansible_collections.modelfleet.fleet"


class CollectionNotFound(RuntimeError):
    pass


@cache
def root() -> Path:
    """The collection's folder (galaxy.yml, playbooks/, roles/, plugins/, profiles/, ansible.cfg)."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except ModuleNotFoundError:
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / "galaxy.yml").is_file():
            return Path(loc)
    raise CollectionNotFound(
        f"the Ansible collection {NAME} is not importable as {PACKAGE}: install modelfleet with pip (pip install . "
        "from a checkout, or the wheel), which installs the collection beside the CLI")


def playbooks_dir() -> Path:
    return root() / "playbooks"


def profiles_dir() -> Path:
    return root() / "profiles"


def ansible_cfg() -> Path:
    return root() / "ansible.cfg"


def checkout() -> Path | None:
    """The git checkout the collection is, when it is one (an editable install): scripts/, the harness's .cache."""
    r = root()
    return r if (r / "scripts" / "setup.sh").is_file() else None
