"""Every role's defaults/main.yml and meta/argument_specs.yml must list the same keys, and every key
must carry the role's prefix. Exit 1 naming each mismatch."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    bad = []
    for role in sorted((ROOT / "roles").iterdir()):
        if not role.is_dir():
            continue
        dfile, sfile = role / "defaults" / "main.yml", role / "meta" / "argument_specs.yml"
        defaults = (yaml.safe_load(dfile.read_text()) or {}) if dfile.exists() else {}
        if not sfile.exists():
            bad.append(f"{role.name}: meta/argument_specs.yml is missing")
            continue
        spec = yaml.safe_load(sfile.read_text())["argument_specs"]
        options = {}
        for entry in spec.values():
            options.update(entry.get("options") or {})
        for k in defaults:
            if k not in options:
                bad.append(f"{role.name}: default {k} has no argument_specs entry")
            elif "default" in options[k] and options[k]["default"] != defaults[k]:
                spec_default = options[k]["default"]
                bad.append(f"{role.name}: {k} default differs: defaults {defaults[k]!r} vs spec {spec_default!r}")
        for k, o in options.items():
            if not k.startswith(role.name + "_"):
                bad.append(f"{role.name}: option {k} lacks the prefix {role.name}_")
            if k not in defaults and not o.get("required"):
                bad.append(f"{role.name}: option {k} is neither required nor given a default in defaults/main.yml")
    for b in bad:
        print(b)
    print(f"argument specs: {'ok' if not bad else str(len(bad)) + ' problem(s)'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
