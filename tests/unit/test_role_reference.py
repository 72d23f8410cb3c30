"""docs/roles.md is what the roles' argument specs give (issue 22: the variable reference is generated)."""

from __future__ import annotations

import importlib.util

from tests.conftest import ROOT


def _script():
    spec = importlib.util.spec_from_file_location("role_reference", ROOT / "scripts" / "role_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_reference_is_current_and_lists_every_option():
    import yaml

    mod = _script()
    assert mod.main(["--check"]) == 0, "run: python scripts/role_reference.py"
    text = mod.render()
    for role in (ROOT / "roles").iterdir():
        specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        for spec in specs.values():
            for name in spec.get("options") or {}:
                assert f"| `{name}` |" in text, name
