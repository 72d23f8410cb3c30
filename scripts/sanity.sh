#!/usr/bin/env bash
# ansible-test sanity on the collection modelfleet.fleet, locally (no containers): the built collection is unpacked in
# a folder named ansible_collections/modelfleet/fleet (ansible-test runs only there) and tested with the
# project venv's ansible-test, each sanity test in the venv ansible-test makes for it (requirements from PyPI).
#
# ansible-test starts each such venv with a pip bootstrap script it downloads from ci-files.testing.ansible.com,
# which this machine cannot reach; its error says the script may be put in its cache by hand. What is put there
# does what that script does -- install pip and the packages it is given -- with pip run from pip's own wheel,
# downloaded from PyPI like everything else.
#
# Usage: scripts/sanity.sh [ansible-test sanity options, e.g. --test pylint]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py="$root/.venv/bin/python"
[ -x "$py" ] || { echo "sanity.sh: $root/.venv is missing: run scripts/setup.sh first" >&2; exit 1; }
# shellcheck source=scripts/lib/pip.sh
. "$root/scripts/lib/pip.sh"

pip_version=$("$py" - <<'PY'
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.host_configs import NativePythonConfig
print(get_venv_packages(NativePythonConfig(version="3.11"))["pip"])
PY
)
cache_dir="$HOME/.ansible/test/cache"
shim="$cache_dir/get_pip_${pip_version//./_}.py"
wheels="$root/.cache/sanity-pip"
if [ ! -s "$shim" ] || ! grep -q "modelfleet" "$shim"; then
  if [ -e "$shim" ]; then echo "sanity.sh: $shim exists and is not modelfleet's; leaving it" >&2; else
    mkdir -p "$cache_dir" "$wheels"
    ls "$wheels"/pip-"$pip_version"-*.whl >/dev/null 2>&1 \
      || pip_run "$root/.venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$wheels" "pip==$pip_version"
    wheel=$(ls "$wheels"/pip-"$pip_version"-*.whl)
    cat >"$shim" <<PY
# Written by modelfleet scripts/sanity.sh in place of ansible-test's pip bootstrap script (not reachable here):
# installs the packages ansible-test names with pip run from pip's wheel.
import os, subprocess, sys
WHEEL = "$wheel"
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, os.path.join(WHEEL, "pip"), "install", *args]))
PY
  fi
fi

# What is tested is what ships: the collection as `ansible-galaxy collection build` packs it (galaxy.yml's
# build_ignore leaves out the CLI package, the tests, the harness and the scripts, which ruff and the tests cover).
work=$(mktemp -d /var/tmp/modelfleet-sanity.XXXXXX)
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/modelfleet/fleet"
mkdir -p "$dest"
"$root/.venv/bin/ansible-galaxy" collection build -f --output-path "$work" "$root" >/dev/null
tar -xzf "$work"/modelfleet-fleet-*.tar.gz -C "$dest"
rm -f "$dest/MANIFEST.json" "$dest/FILES.json"
cd "$dest"
start=$(date +%s)
rc=0
"$root/.venv/bin/ansible-test" sanity --python 3.11 --color no "$@" 2>&1 | grep -v "is ignored: it is neither" || rc=$?
echo "ansible-test sanity: rc=$rc in $(( $(date +%s) - start )) s"
exit "$rc"
