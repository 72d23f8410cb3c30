#!/usr/bin/env bash
# The main job on the built-in local fleet (README command 1): set-up (idempotent), three systemd
# containers, then the smoke playbook over them. Later stages grow this into the full
# deploy-and-benchmark flow.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh" --image
# shellcheck disable=SC1091
source "$root/.venv/bin/activate"
export ANSIBLE_CONFIG="$root/ansible.cfg"
"$root/scripts/fleet.sh" up
ansible-playbook playbooks/smoke.yml "$@"
