#!/usr/bin/env bash
# The main job on the built-in local fleet (README command 1): set-up (idempotent), three systemd
# containers, the local hub server, then deploy_kimi_int4.yml's flow with the tiny-model profile:
# preflight on the controller, canary (mf-node-1) first - storage, fetch from the hub, vLLM CPU
# environment, hardened unit, readiness, benchmark - then the other two receive the verified model from the
# canary (the hub sends one copy) and switch. Ends with a one-screen summary and where the reports are.
#   scripts/demo.sh [--check] [modelfleet deploy options]     (MODELFLEET_DEMO_PROFILE=tiny-llama-b: the other model)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh" --all
# shellcheck disable=SC1091
source "$root/.venv/bin/activate"
export ANSIBLE_CONFIG="$root/ansible.cfg"
export MODELFLEET_STATE_DIR=${MODELFLEET_STATE_DIR:-$root/.cache/state}
"$root/scripts/fleet.sh" up
hub=$(python -m modelfleet.harness.hubctl start "$root/.cache/demo-hub" | python -c 'import json,sys; print(json.load(sys.stdin)["url"])')
echo "local hub server: $hub (stop: python -m modelfleet.harness.hubctl stop .cache/demo-hub)"
profile=${MODELFLEET_DEMO_PROFILE:-tiny-llama}
start=$(date +%s)
rc=0
python -m modelfleet.cli deploy "$profile" --playbook deploy_kimi_int4.yml -i inventory/local/local.fleet.yml \
  -e "hf_fetch_endpoint=$hub" "$@" || rc=$?
echo "demo wall time: $(( $(date +%s) - start )) s (exit $rc)"
python - "$hub" <<'PY' || true
import json, sys, urllib.request
s = json.loads(urllib.request.urlopen(sys.argv[1] + "/_modelfleet/stats").read())
print(f"hub egress since the hub started: {s['bytes_served']} bytes in {s['requests']} file requests "
      "(one copy per model for the whole fleet, plus header-only inspections)")
PY
latest=$(ls -td "$MODELFLEET_STATE_DIR"/runs/*/ 2>/dev/null | head -1)
if [ -n "$latest" ] && [ -d "$latest/bench" ]; then
  echo "reports: ${latest}bench/ (HTML + PNG per host, comparison.md)"
  cat "${latest}bench/comparison.md" 2>/dev/null || true
fi
exit $rc
