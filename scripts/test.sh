#!/usr/bin/env bash
# The test suite (README command 2): set-up (idempotent), lint, syntax checks, molecule scenarios,
# then pytest (unit + integration against the real harness). pytest runs last so its summary line
# closes the output.
#   scripts/test.sh              everything
#   scripts/test.sh --quick      the inner loop: lint, unit and integration tests (real hub, real vLLM CPU,
#                                real containers), no molecule scenario; a few minutes once set-up is done
#   MODELFLEET_SCENARIOS="smoke" scripts/test.sh    only these molecule scenarios ("" for none)
#   MODELFLEET_PYTEST_WORKERS=N  pytest-xdist workers (default 2; 0 runs pytest in one process)
# Arguments after the options go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
setup_start=$(date +%s)
"$root/scripts/setup.sh" --all
# shellcheck disable=SC1091
source "$root/.venv/bin/activate"
export MODELFLEET_HOST_IMAGE MODELFLEET_HOST_VLLM_IMAGE
MODELFLEET_HOST_IMAGE=$("$root/images/host/build.sh")
if [ "$quick" = 0 ]; then
  echo "[setup] the serving host image (vLLM CPU venv baked in; built once per recipe hash)"
  MODELFLEET_HOST_VLLM_IMAGE=$("$root/images/host-vllm/build.sh")
fi
export ANSIBLE_CONFIG="$root/ansible.cfg"
echo "set-up took $(( $(date +%s) - setup_start )) s"
t0=$(date +%s)
timings=()
last_step="" last_start=$t0
step() {
  local now; now=$(date +%s)
  [ -n "$last_step" ] && timings+=("$(printf '%-44s %6d s' "$last_step" "$(( now - last_start ))")")
  last_step=$* last_start=$now
  printf '\n== %s == (%d s since start)\n' "$*" "$(( now - t0 ))"
}

rm -f "$root/.cache/test-timings"
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
[ "$quick" = 1 ] && scenarios=""

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
    echo "molecule $s $(( $(date +%s) - start ))" >>"$root/.cache/test-timings"
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
if [ $(( ${#heavy[@]} + ${#rest[@]} )) = 0 ]; then
  echo "(no molecule scenario in this run)"
else
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
fi

step "pytest"
printf '\n== time per step (set-up %d s) ==\n' "$(( t0 - setup_start ))"
printf '%s\n' "${timings[@]}"
[ -s "$root/.cache/test-timings" ] && sed 's/^molecule \(.*\) \(.*\)$/  molecule scenario \1: \2 s/' "$root/.cache/test-timings"
workers=${MODELFLEET_PYTEST_WORKERS:-2}
xdist=()
[ "$workers" -gt 0 ] && xdist=(-n "$workers" --dist loadgroup)
python -m pytest -p no:cacheprovider "${xdist[@]}" --durations=15 "$@"
