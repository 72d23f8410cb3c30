#!/usr/bin/env bash
# Run on the lent GPU machine (the `device` tool), as root, from the checkout's root:
#   scripts/device/unit_cache_check.sh [BEFORE_TEMPLATE]
# Renders the vllm_service unit from the role's template with real Ansible (scripts/device/render_unit.yml,
# the vllm_unit module), then runs CUDA initialisation, a Triton JIT kernel, torch.compile and a driver PTX JIT
# inside that unit's file-system sandbox (scripts/device/unit_sandbox.py). With BEFORE_TEMPLATE (an older
# copy of the template) the same is done for it first, so one run shows before and after. Needs the wheels
# in .whl/ (ansible-core and its deps the machine lacks; docs/gpu-unit-sandbox.md). Writes the log to $OUT.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/out}; mkdir -p "$out"
log="$out/unit-cache-check.log"
exec > >(tee "$log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site ANSIBLE_CONFIG=$root/ansible.cfg ANSIBLE_LOCAL_TEMP=/tmp/ans ANSIBLE_REMOTE_TEMP=/tmp/ans
py=$(command -v python3)
echo "== machine: $(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | head -1);" \
  "$(uname -r); $(date -u +%Y-%m-%dT%H:%MZ)"
home=/var/cache/modelfleet/vllm
render() {  # template out
  python3 -m ansible playbook -i localhost, -c local scripts/device/render_unit.yml \
    -e "render_root=$root render_out=$2 render_template=$1 render_python=$py render_devices=nvidia" \
    -e "render_profile=$root/profiles/kimi-k2.5-int4.yml render_gpu_count=1" \
    -e "render_model_dir=/models/moonshotai--Kimi-K2.5/0123456789abcdef0123456789abcdef01234567" \
    -e "ansible_python_interpreter=$py" >/tmp/render.log 2>&1 || { cat /tmp/render.log; return 1; }
}
check() {  # name template
  local unit=/tmp/unit-$1.service tpl=$2
  case $tpl in /*) ;; *) tpl=$root/$tpl ;; esac
  echo; echo "== $1: $2"
  render "$tpl" "$unit" || return 2
  cp "$unit" "$out/unit-$1.service"
  # a fresh service user and cache folder each time: nothing cached by the other run
  userdel modelfleet-vllm 2>/dev/null; rm -rf "$home"
  python3 scripts/device/unit_sandbox.py "$unit" --home "$home" --python "$py"
}
rc_before=skipped
if [ -n "${1:-}" ]; then check before "$1"; rc_before=$?; fi
check after roles/vllm_service/templates/vllm.service.j2; rc_after=$?
# rc 1: a step failed inside the sandbox; 2: rendering failed; 3: the sandbox could not be built
echo; echo "== verdict: before rc=$rc_before (expected 1: a step fails in the sandbox), after rc=$rc_after (expected 0)"
[ "$rc_after" = 0 ] && { [ "$rc_before" = skipped ] || [ "$rc_before" = 1 ]; }
