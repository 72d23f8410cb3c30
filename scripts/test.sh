#!/usr/bin/env bash
# The test suite (README command 2): set-up (idempotent), lint, syntax checks, molecule scenarios,
# then pytest (unit + integration against the real harness). pytest runs last so its summary line
# closes the output.
#   scripts/test.sh              everything
#   scripts/test.sh --quick      the inner loop: lint, unit and integration tests (real hub, real vLLM CPU,
#                                real containers), no molecule scenario; a few minutes once set-up is done
#   MODELFLEET_SCENARIOS="smoke" scripts/test.sh    only these molecule scenarios ("" for none)
#   MODELFLEET_PYTEST_WORKERS=N  pytest-xdist workers (default 2; 0 runs pytest in one process)
#   MODELFLEET_GROUP_DATA_PARALLEL=1  molecule/group also deploys its hosts as a data-parallel group (about 8 more
#                                minutes beside molecule/fleet; off by default, docs/testing.md)
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
# The slower checks (module docs, playbook syntax, ansible-lint: about half a minute) run first in the second lane
# when molecule runs, beside molecule/fleet's start, instead of before it; their failure fails the run the
# same way (and is printed at the end). With no scenario (--quick) they run here.
slow_lint() {
  local p kind f
  for kind in modules:module inventory:inventory lookup:lookup; do
    for f in "plugins/${kind%%:*}"/*.py; do
      [ -e "$f" ] || continue
      ansible-doc -t "${kind#*:}" "modelfleet.fleet.$(basename "$f" .py)" >/dev/null || { echo "ansible-doc: $f"; return 1; }
    done
  done
  echo "module and plugin docs (ansible-doc, by FQCN): ok"
  for p in playbooks/*.yml; do ansible-playbook --syntax-check "$p" >/dev/null || { echo "syntax: $p"; return 1; }; done
  echo "playbook syntax: ok"
  ansible-lint --profile production --offline -q || { echo "ansible-lint: failed"; return 1; }
  echo "ansible-lint (production profile): ok"
}
# The collection as it ships, through ansible-test sanity (docs schema, pylint, pep8, imports, ...): about
# 35 CPU-seconds. In the two-lane run it comes after the second lane's pytest, on the core that lane would
# otherwise leave idle while molecule/fleet ends, not beside molecule/fleet's start (where it lengthened
# the critical path by 20-30 s; docs/testing.md).
sanity() {
  "$root/scripts/sanity.sh" >"$root/.cache/sanity.log" 2>&1 || { tail -n 40 "$root/.cache/sanity.log"; echo "ansible-test sanity: failed"; return 1; }
  tail -n 1 "$root/.cache/sanity.log"
}
run_slow_lint() {
  local start rc=0
  start=$(date +%s)
  slow_lint >"$root/.cache/lint.log" 2>&1 || rc=$?
  echo "lint (ansible-doc, syntax, ansible-lint) $(( $(date +%s) - start ))" >>"$root/.cache/test-timings"
  return $rc
}
run_sanity() {
  local start rc=0
  start=$(date +%s)
  sanity >>"$root/.cache/lint.log" 2>&1 || rc=$?
  echo "$rc" >"$root/.cache/sanity.rc"
  echo "lint (ansible-test sanity, after the second lane's pytest) $(( $(date +%s) - start ))" >>"$root/.cache/test-timings"
  return $rc
}

# molecule/WIP lists scenarios that are written but not yet green; they run only when named explicitly.
wip=$(grep -vE '^\s*(#|$)' molecule/WIP 2>/dev/null || true)
scenarios=${MODELFLEET_SCENARIOS-$(ls molecule | grep -vxF -f <(printf '%s\n' $wip) || true)}
[ "$quick" = 1 ] && scenarios=""

# One scenario: its whole log goes to .cache/molecule-<s>.log; what it prints is written in one piece so
# two lanes do not interleave inside a scenario's report.
run_scenario() {
  local s=$1 start report figures="$root/.cache/molecule-$1-figures.txt"
  rm -f "$figures"
  start=$(date +%s)
  printf -- '-- molecule test -s %s started (%d s since start)\n' "$s" "$(( start - t0 ))"
  # molecule wraps its output at the terminal's width (80 columns without one): wide enough for a test id
  # each line of the log carries its wall-clock time (where a scenario's minutes go; pipefail keeps molecule's status)
  if COLUMNS=250 molecule test -s "$s" 2>&1 | awk '{ print strftime("%H:%M:%S"), $0; fflush() }' \
       >"$root/.cache/molecule-$s.log"; then
    report=$(grep -E "::.*(PASSED|FAILED|ERROR)" "$root/.cache/molecule-$s.log" \
             | sed -E 's/\x1b\[[0-9;]*m//g; s/^[^t]*tests/  tests/; s/[[:space:]]*\[?[[:space:]]*$//' || true)
    # the figures its verifier measured (molecule/fleet: the endpoint under a switch and a kill, the watchdog)
    [ -s "$figures" ] && report+=$'\n-- figures the verifier measured:\n'"$(sed 's/^/  /' "$figures")"
    printf '\n== molecule test -s %s ==\n%s\nscenario %s passed in %d s\n' "$s" "$report" "$s" "$(( $(date +%s) - start ))"
    echo "molecule $s $(( $(date +%s) - start ))" >>"$root/.cache/test-timings"
    return 0
  fi
  # what failed first (the verifier's test ids and pytest's E lines, the failed tasks), then the log's tail
  report=$( { sed -E 's/\x1b\[[0-9;]*m//g' "$root/.cache/molecule-$s.log" \
              | grep -E "::.*(FAILED|ERROR)|(│|^[0-9:]+) +E  |fatal: \[|FAILED! =>" | head -n 60
            [ -s "$figures" ] && { echo "-- figures the verifier measured:"; sed 's/^/  /' "$figures"; }
            echo "-- the log's last 40 lines:"; tail -n 40 "$root/.cache/molecule-$s.log"; } || true)
  printf '\n== molecule test -s %s ==\n%s\nmolecule scenario %s failed after %d s (full log: .cache/molecule-%s.log)\n' \
    "$s" "$report" "$s" "$(( $(date +%s) - start ))" "$s"
  return 1
}
run_lane() { local s; for s in "$@"; do run_scenario "$s" || return 1; done; }

# Two lanes (MODELFLEET_MOLECULE_LANES=1 for one): molecule/fleet, the longest, then the short scenarios in
# one; the others in order in the second. Scenarios share nothing (own containers, ports, hub, ephemeral folder), and much
# of their time is waiting on vLLM start-up and on one task at a time, so the lanes overlap well on two
# cores.
# pytest in two parts: everything but the tests marked `exclusive` (the benchmark client's truth checks,
# which need quiet cores) runs with pytest-xdist in the second lane once its scenarios are done, beside
# molecule/fleet; its report is printed at the end. The exclusive tests run last, alone on the machine.
workers=${MODELFLEET_PYTEST_WORKERS:-2}
xdist=()
[ "$workers" -gt 0 ] && xdist=(-n "$workers" --dist loadgroup)
# The exclusive tests' summary is read from this log at the end; in the two-lane run they start in the second
# lane once its scenarios and the shared pytest are done: their vLLM server starts beside molecule/fleet's
# tail (on the core the finished lane left idle) and nothing is measured until this script writes
# $quiet_file after the first lane has ended (tests/conftest.py waits for it).
quiet_file="$root/.cache/quiet-machine"
rm -f "$quiet_file" "$root/.cache/pytest-exclusive.rc" "$root/.cache/sanity.rc"
pytest_exclusive() {
  local rc=0
  MODELFLEET_QUIET_FILE="$quiet_file" MODELFLEET_QUIET_PID=$$ \
    python -m pytest -p no:cacheprovider -m exclusive --durations=5 "$@" >"$root/.cache/pytest-exclusive.log" 2>&1 \
    || rc=$?
  echo "$rc" >"$root/.cache/pytest-exclusive.rc"
}
pytest_shared() {
  local start rc=0
  start=$(date +%s)
  python -m pytest -p no:cacheprovider "${xdist[@]}" -m "not exclusive" --durations=10 "$@" \
    >"$root/.cache/pytest-shared.log" 2>&1 || rc=$?
  echo "pytest (all but exclusive, ${workers} workers) $(( $(date +%s) - start ))" >>"$root/.cache/test-timings"
  [ "$rc" = 5 ] && rc=0  # a filter (-k ...) that leaves only exclusive tests
  return $rc
}

# The short host scenarios (nvidia_env, smoke, storage: about 400 s together beside the other lane) run after
# molecule/fleet in its lane: with molecule/group's multi-host deploy (about 1,900 s beside molecule/fleet)
# the second lane had become the longer one by about 800 s (docs/testing.md).
heavy=() rest=() after_heavy=()
for s in $scenarios; do
  [ -f "molecule/$s/molecule.yml" ] || continue
  case "$s" in
    fleet) heavy+=("$s") ;;
    nvidia_env|smoke|storage) after_heavy+=("$s") ;;
    *) rest+=("$s") ;;
  esac
done
if [ ${#heavy[@]} -gt 0 ]; then heavy+=("${after_heavy[@]}"); else rest+=("${after_heavy[@]}"); fi
shared_rc=0 mol_rc=0 lint_rc=0
if [ $(( ${#heavy[@]} + ${#rest[@]} )) = 0 ]; then
  step "module docs, playbook syntax, ansible-lint, ansible-test sanity"
  slow_lint
  sanity
  step "pytest (all but exclusive)"
  pytest_shared "$@" || shared_rc=$?
elif [ "${MODELFLEET_MOLECULE_LANES:-2}" = 1 ] || [ ${#heavy[@]} = 0 ] || [ ${#rest[@]} = 0 ]; then
  step "module docs, playbook syntax, ansible-lint, ansible-test sanity"
  slow_lint
  sanity
  step "molecule (${#heavy[@]} + ${#rest[@]} scenarios, one lane), then pytest"
  run_lane "${heavy[@]}" "${rest[@]}" || mol_rc=1
  pytest_shared "$@" || shared_rc=$?
else
  step "molecule (${#heavy[@]} + ${#rest[@]} scenarios, 2 lanes: lint, the others, then pytest in the second)"
  run_lane "${heavy[@]}" & lane1=$!
  { run_slow_lint || exit 11; run_lane "${rest[@]}" || exit 1; r=0; pytest_shared "$@" || r=10
    run_sanity || true  # its status is read from .cache/sanity.rc below
    pytest_exclusive "$@"; exit $r; } & lane2=$!
  wait "$lane1" || mol_rc=1
  lane1_end=$(date +%s)
  touch "$quiet_file"
  wait "$lane2" || { r=$?; case "$r" in 10) shared_rc=1 ;; 11) lint_rc=1 ;; *) mol_rc=1 ;; esac; }
  if [ -s "$root/.cache/sanity.rc" ] && [ "$(cat "$root/.cache/sanity.rc")" != 0 ]; then lint_rc=1; fi
  [ -s "$root/.cache/pytest-exclusive.rc" ] \
    && echo "pytest (exclusive, after molecule/fleet) $(( $(date +%s) - lane1_end ))" >>"$root/.cache/test-timings"
  printf '\n== module docs, playbook syntax, ansible-lint, ansible-test sanity (second lane) ==\n'
  cat "$root/.cache/lint.log"
fi

step "reports (and pytest exclusive, alone, when it did not run in the second lane)"
printf '\n== time per step (set-up %d s) ==\n' "$(( t0 - setup_start ))"
printf '%s\n' "${timings[@]}"
[ -s "$root/.cache/test-timings" ] && sed 's/^\(molecule\|pytest\|lint\) \(.*\) \([0-9]*\)$/  \1 \2: \3 s/' "$root/.cache/test-timings"
if [ "$lint_rc" != 0 ]; then
  echo "lint: module docs, playbook syntax, ansible-lint or ansible-test sanity failed (report above)"
  exit 1
fi
if [ "$mol_rc" != 0 ]; then
  echo "molecule: a scenario failed (report above)"
  exit 1
fi
printf '\n== pytest (all but exclusive) ==\n'
cat "$root/.cache/pytest-shared.log"
if [ ! -s "$root/.cache/pytest-exclusive.rc" ]; then  # one lane, or no scenario: they run now, alone
  touch "$quiet_file"
  pytest_exclusive "$@"
fi
printf '\n== pytest (exclusive) ==\n'
cat "$root/.cache/pytest-exclusive.log"
excl_rc=$(cat "$root/.cache/pytest-exclusive.rc")
[ "$excl_rc" = 5 ] && excl_rc=0  # a filter (-k ...) that leaves no exclusive test
# one closing line for both parts, from each part's pytest summary line
summary_line() {
  local f
  for f in "$root/.cache/pytest-shared.log" "$root/.cache/pytest-exclusive.log"; do
    grep -E "^=+ .* in [0-9.]+s" "$f" 2>/dev/null | tail -n 1
  done | awk '{ for (i = 1; i < NF; i++) { n = $i + 0; w = $(i + 1); sub(/,$/, "", w)
                  if (w == "passed") p += n; else if (w == "failed" || w == "error" || w == "errors") x += n
                  else if (w == "skipped") s += n } }
              END { printf "pytest: %d passed, %d failed, %d skipped\n", p, x, s }'
}
summary_line
# the steps' times once more, last: a CI that keeps only the output's tail keeps them (where a slow run's time went)
[ -s "$root/.cache/test-timings" ] && printf 'times: %s\n' "$(sed -E 's/^(.*) ([0-9]+)$/\1 \2 s/' "$root/.cache/test-timings" \
  | paste -sd ';' | sed 's/;/; /g'), total $(( $(date +%s) - setup_start )) s"
[ "$shared_rc" = 0 ] && [ "$excl_rc" = 0 ]
