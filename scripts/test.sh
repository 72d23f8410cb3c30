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

# One scenario: its whole log goes to .cache/molecule-<s>.log; what it prints is written in one piece so
# two lanes do not interleave inside a scenario's report.
run_scenario() {
  local s=$1 start report
  start=$(date +%s)
  printf -- '-- molecule test -s %s started (%d s since start)\n' "$s" "$(( start - t0 ))"
  if molecule test -s "$s" >"$root/.cache/molecule-$s.log" 2>&1; then
    report=$(grep -E "(PASSED|FAILED|ERROR).*\[" "$root/.cache/molecule-$s.log" \
             | sed 's/\x1b\[[0-9;]*m//g; s/^[^t]*tests/  tests/' || true)
    printf '\n== molecule test -s %s ==\n%s\nscenario %s passed in %d s\n' "$s" "$report" "$s" "$(( $(date +%s) - start ))"
    return 0
  fi
  report=$(tail -n 80 "$root/.cache/molecule-$s.log")
  printf '\n== molecule test -s %s ==\n%s\nmolecule scenario %s failed after %d s (full log: .cache/molecule-%s.log)\n' \
    "$s" "$report" "$s" "$(( $(date +%s) - start ))" "$s"
  return 1
}
run_lane() { local s; for s in "$@"; do run_scenario "$s" || return 1; done; }

# Two lanes (MODELFLEET_MOLECULE_LANES=1 for one): molecule/fleet, the longest, in one; the others in
# order in the second. Scenarios share nothing (own containers, ports, hub, ephemeral folder), and much
# of their time is waiting on vLLM start-up and on one task at a time, so the lanes overlap well on two
# cores.
heavy=() rest=()
for s in $scenarios; do
  [ -f "molecule/$s/molecule.yml" ] || continue
  if [ "$s" = fleet ]; then heavy+=("$s"); else rest+=("$s"); fi
done
step "molecule (${#heavy[@]} + ${#rest[@]} scenarios, ${MODELFLEET_MOLECULE_LANES:-2} lane(s))"
if [ "${MODELFLEET_MOLECULE_LANES:-2}" = 1 ] || [ ${#heavy[@]} = 0 ] || [ ${#rest[@]} = 0 ]; then
  run_lane "${heavy[@]}" "${rest[@]}"
else
  run_lane "${heavy[@]}" & lane1=$!
  run_lane "${rest[@]}" & lane2=$!
  rc=0
  wait "$lane1" || rc=1
  wait "$lane2" || rc=1
  [ "$rc" = 0 ] || { echo "molecule: a scenario failed (report above)"; exit 1; }
fi

step "pytest"
python -m pytest -p no:cacheprovider "$@"
