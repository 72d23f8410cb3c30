#!/usr/bin/env bash
# Mutation testing of the guard and validation code (issue 19), with mutmut (pinned in
# requirements/mutation.txt): disk planning and deletion (disk.py), in-use discovery (in_use.py), the unit
# and environment-file validators (vllm_unit.py) and fleet-file validation (fleet.py). Prints the score
# and sorts the surviving mutants (scripts/mutation_report.py): prose-only changes to a message, mutants
# explained one by one in scripts/mutation-explained.txt, and open ones (the script fails while any is).
# Not part of CI (it runs each mutant against the tests that reach its function: minutes on two cores).
#
#   scripts/mutation.sh                 all four files
#   scripts/mutation.sh disk.py         one of them
#   MODELFLEET_MUTATION_JOBS=N          parallel mutants (default: the number of cores)
#
# How it maps the layout: mutmut names a mutant after its file's path, and the code runs under its collection
# name, ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.* (plugin_utils for fleet.py). So
# the files are staged at that path in a work folder, and a pytest plugin loaded only in mutmut's test process
# (mutation_paths.py) puts the work folder first on sys.path: the names agree and the tests import the mutants.
# Tests that run the CLI, ansible-inventory or a module in a child process get the unmutated checkout (through
# the editable install): mutmut maps mutants to tests by what the test process itself calls.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ -x .venv/bin/python ] || { echo "scripts/mutation.sh: run scripts/setup.sh first (no .venv)" >&2; exit 2; }
# shellcheck disable=SC1091
source .venv/bin/activate
pip install -q --disable-pip-version-check -r requirements/mutation.txt

files=("$@")
[ ${#files[@]} -gt 0 ] || files=(disk.py in_use.py vllm_unit.py fleet.py)
# where each file lives in the collection (fleet.py is controller-only: plugin_utils)
where() { if [ "$1" = fleet.py ]; then echo plugins/plugin_utils; else echo plugins/module_utils/modelfleet; fi; }
for f in "${files[@]}"; do
  [ -f "$(where "$f")/$f" ] || { echo "scripts/mutation.sh: no $(where "$f")/$f" >&2; exit 2; }
done
# The tests that check these rules in-process (a test that runs the code in a child process still runs, but
# mutmut maps mutants to tests by what the test process itself calls).
tests=(tests/unit/test_disk_plan.py tests/unit/test_disk_guards.py tests/unit/test_disk_contract.py
       tests/integration/test_storage_safety.py tests/unit/test_in_use.py tests/unit/test_vllm_unit.py
       tests/unit/test_vllm_unit_contract.py tests/unit/test_fleet_inventory.py tests/unit/test_fleet_exact.py
       tests/integration/test_bad_input.py)

work=${MODELFLEET_MUTATION_DIR:-/var/tmp/modelfleet-mutation}
coll=ansible_collections/modelfleet/fleet
rm -rf "$work"
mkdir -p "$work/$coll/plugins"
cp -r plugins/module_utils plugins/plugin_utils "$work/$coll/plugins/"   # what mutmut mutates and the tests import
cp -r tests src profiles inventory playbooks roles plugins meta galaxy.yml ansible.cfg "$work/"  # the rest, unmutated
cat >"$work/mutation_paths.py" <<'PY'
"""pytest plugin (scripts/mutation.sh): the folder holding mutmut's mutated ansible_collections/ first on sys.path,
in the test process only."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
# Ansible run by a test in a child process finds the collection in the checkout (unmutated), as it does there
CHECKOUT = os.environ["MODELFLEET_MUTATION_CHECKOUT"]
os.environ["ANSIBLE_COLLECTIONS_PATH"] = f"{CHECKOUT}/.cache/collection-self:{CHECKOUT}/.cache/collections"
PY
export MODELFLEET_MUTATION_CHECKOUT="$root"

toml_list() { local sep="" x; printf '['; for x in "$@"; do printf '%s"%s"' "$sep" "$x"; sep=", "; done; printf ']'; }
mutate=()
for f in "${files[@]}"; do mutate+=("$coll/$(where "$f")/$f"); done
# the project's pytest settings (markers), then mutmut's
awk '/^\[tool\.pytest\.ini_options\]/ { f = 1; print; next } f && /^\[[A-Za-z]/ { exit } f' pyproject.toml \
  >"$work/pyproject.toml"
cat >>"$work/pyproject.toml" <<EOF
[tool.mutmut]
paths_to_mutate = $(toml_list "${mutate[@]}")
also_copy = $(toml_list tests src profiles inventory playbooks roles meta galaxy.yml ansible.cfg pyproject.toml plugins mutation_paths.py "$coll")
pytest_add_cli_args = ["-p", "mutation_paths", "-p", "no:cacheprovider", "-p", "no:xdist", "-q"]
pytest_add_cli_args_test_selection = $(toml_list "${tests[@]}")
EOF

cd "$work"
# the property tests with a fiftieth of their examples per mutant (the full counts run in the suite)
export MODELFLEET_PROPERTY_SCALE=${MODELFLEET_PROPERTY_SCALE:-0.02}
start=$(date +%s)
mutmut run --max-children "${MODELFLEET_MUTATION_JOBS:-$(nproc)}" >"$work/run.log" 2>&1 || {
  tail -n 30 "$work/run.log" >&2
  echo "scripts/mutation.sh: mutmut run failed (log: $work/run.log)" >&2
  exit 1
}
mutmut results --all true >"$work/results.txt" 2>&1 || true
# one line per mutant: "<name>: <status>"
awk -F': ' 'NF == 2 { n[$2]++; t++ } END {
  k = n["killed"] + 0; s = n["survived"] + 0
  printf "mutants: %d (killed %d, survived %d, no tests %d, timeout %d, suspicious %d, skipped %d)\n", t, k, s,
    n["no tests"] + 0, n["timeout"] + 0, n["suspicious"] + 0, n["skipped"] + 0
  if (k + s > 0) printf "score: %.1f%% of the mutants that the tests reach are killed\n", 100 * k / (k + s)
}' "$work/results.txt"
echo "took $(( $(date +%s) - start )) s"
# the survivors by class (message text, explained in scripts/mutation-explained.txt, open) and each open one
# with its diff; exits 1 while any is open
python "$root/scripts/mutation_report.py" "$work" "$root/scripts/mutation-explained.txt"
