#!/usr/bin/env bash
# Mutation testing (mutmut) of the guard and validation code (issue 19): disk planning and deletion, in-use
# discovery, unit/env rendering validators, secret files, fleet validation, size parsing. Not part of CI
# (it reruns the guard tests once per mutant). Prints the score and every surviving mutant.
#   scripts/mutation.sh                 the whole set
#   scripts/mutation.sh 'disk*'         only mutants whose name matches (mutmut's own selection)
# Works in a copy of the working tree (.cache/mutation); the checkout is never modified.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh" >/dev/null
# shellcheck disable=SC1091
source "$root/.venv/bin/activate"
python -c 'import mutmut' 2>/dev/null || { echo "mutmut is missing from .venv: re-run scripts/setup.sh" >&2; exit 1; }
work=${MODELFLEET_MUTATION_DIR:-$root/.cache/mutation}
rm -rf "$work"
mkdir -p "$work"
git ls-files -co --exclude-standard -z | grep -zv '^\.cache/' | xargs -0 cp --parents -t "$work"
cd "$work"
cat >setup.cfg <<'CFG'
[mutmut]
source_paths=plugins/module_utils/modelfleet/
only_mutate=
    plugins/module_utils/modelfleet/disk.py
    plugins/module_utils/modelfleet/in_use.py
    plugins/module_utils/modelfleet/vllm_unit.py
    plugins/module_utils/modelfleet/unit_file.py
    plugins/module_utils/modelfleet/secrets.py
    plugins/module_utils/modelfleet/fleet.py
    plugins/module_utils/modelfleet/units.py
also_copy=
    src/
    plugins/
    profiles/
    roles/
    scripts/
    ansible.cfg
pytest_add_cli_args_test_selection=
    tests/unit/test_disk_plan.py
    tests/integration/test_storage_safety.py
    tests/unit/test_vllm_unit.py
    tests/unit/test_fleet_inventory.py
    tests/integration/test_bad_input.py
    tests/integration/test_storage_reclaim.py
pytest_add_cli_args=
    -p
    no:cacheprovider
    -q
    -p
    no:randomly
CFG
start=$(date +%s)
export MODELFLEET_PROPERTY_EXAMPLES=${MODELFLEET_PROPERTY_EXAMPLES:-300}
mutmut run --max-children "${MODELFLEET_MUTATION_WORKERS:-2}" "$@" >"$work/run.log" 2>&1 || true
mutmut results --all true >"$work/results.txt" 2>&1 || true
python - "$work/results.txt" "$(( $(date +%s) - start ))" <<'PY'
import collections, re, sys
counts, survived = collections.Counter(), []
for line in open(sys.argv[1]):
    m = re.match(r"\s*(\S+__mutmut_\d+): (.+)$", line)
    if m:
        status = m.group(2).strip()
        counts[status] += 1
        if status == "survived":
            survived.append(m.group(1))
total = sum(counts.values())
killed = counts.get("killed", 0) + counts.get("timeout", 0)
print(f"mutation testing: {total} mutants in {sys.argv[2]} s: " + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
if total:
    print(f"score: {killed}/{total} killed ({100 * killed / total:.1f}%)")
for name in survived:
    print(f"  survived: {name}   (mutmut show {name})")
PY
