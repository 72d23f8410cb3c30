#!/usr/bin/env bash
# The test suite (README command 2): set-up (idempotent), lint, syntax checks, molecule scenarios,
# then pytest (unit + integration against the real harness). pytest runs last so its summary line
# closes the output.
#   scripts/test.sh              everything
#   MODELFLEET_SCENARIOS="smoke" scripts/test.sh    only these molecule scenarios ("" for none)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
setup_start=$(date +%s)
"$root/scripts/setup.sh" --all
# shellcheck disable=SC1091
source "$root/.venv/bin/activate"
export MODELFLEET_HOST_IMAGE
MODELFLEET_HOST_IMAGE=$("$root/images/host/build.sh")
export ANSIBLE_CONFIG="$root/ansible.cfg"
echo "set-up took $(( $(date +%s) - setup_start )) s"
t0=$(date +%s)
step() { printf '\n== %s == (%d s since start)\n' "$*" "$(( $(date +%s) - t0 ))"; }

step "ruff"
ruff check .
step "yamllint"
yamllint -s .
step "argument specs match defaults"
python scripts/check_argument_specs.py
step "module docs (ansible-doc)"
for m in plugins/modules/*.py; do
  [ -e "$m" ] || continue
  ansible-doc -t module -M plugins/modules "$(basename "$m" .py)" >/dev/null
done
step "playbook syntax"
for p in playbooks/*.yml; do ansible-playbook --syntax-check "$p" >/dev/null; echo "ok $p"; done
step "ansible-lint (production profile)"
ansible-lint --profile production --offline -q

# molecule/WIP lists scenarios that are written but not yet green; they run only when named explicitly.
wip=$(grep -vE '^\s*(#|$)' molecule/WIP 2>/dev/null || true)
scenarios=${MODELFLEET_SCENARIOS-$(ls molecule | grep -vxF -f <(printf '%s\n' $wip) || true)}
for s in $scenarios; do
  [ -f "molecule/$s/molecule.yml" ] || continue
  step "molecule test -s $s"
  start=$(date +%s)
  molecule test -s "$s" >"$root/.cache/molecule-$s.log" 2>&1 || {
    tail -n 80 "$root/.cache/molecule-$s.log"
    echo "molecule scenario $s failed (full log: .cache/molecule-$s.log)"
    exit 1
  }
  grep -E "(PASSED|FAILED|ERROR).*\[" "$root/.cache/molecule-$s.log" | sed 's/\x1b\[[0-9;]*m//g; s/^[^t]*tests/  tests/' || true
  echo "scenario $s passed in $(( $(date +%s) - start )) s"
done

step "pytest"
python -m pytest -p no:cacheprovider "$@"
