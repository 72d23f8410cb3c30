#!/usr/bin/env bash
# Build (or reuse) the systemd-booted Debian 12 image that molecule scenarios and the local fleet use.
# No container registry is reachable here, so the image is made from Debian packages with debootstrap
# and imported into podman. The tag carries a hash of this recipe: a changed recipe means a new image,
# an unchanged one is reused (the second run costs about a second).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=${MODELFLEET_HOST_IMAGE_NAME:-localhost/modelfleet-host}
hash=$(cat "$here/build.sh" "$here/packages.txt" | sha256sum | cut -c1-12)
tag="$name:$hash"

die() { echo "images/host/build.sh: $*" >&2; exit 1; }
command -v podman >/dev/null || die "podman is not installed; run scripts/setup.sh (or: apt-get install podman runc)"
command -v debootstrap >/dev/null || die "debootstrap is not installed; run scripts/setup.sh (or: apt-get install debootstrap)"
[ "$(id -u)" = 0 ] || die "building the host image needs root (debootstrap chroots); run as root"

if podman image exists "$tag"; then
  echo "$tag"
  exit 0
fi

# The mirror is whatever this machine's apt already uses (deb822 or one-line format).
mirror=${MODELFLEET_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
fi
if [ -z "$mirror" ]; then
  mirror=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
fi
[ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list*; set MODELFLEET_DEBIAN_MIRROR=<url>"

pkgs=$(grep -vE '^\s*(#|$)' "$here/packages.txt" | paste -sd, -)
work=$(mktemp -d /var/tmp/modelfleet-rootfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "building $tag from $mirror (debootstrap, about a minute)" >&2
debootstrap --variant=minbase --include="$pkgs" bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
# Same apt sources inside as outside, so roles that install packages in the container can.
cp /etc/apt/sources.list "$work/rootfs/etc/apt/sources.list" 2>/dev/null || true
cp -r /etc/apt/sources.list.d/. "$work/rootfs/etc/apt/sources.list.d/" 2>/dev/null || true
# Quiet, container-friendly systemd: no getty, no udev triggers, no timers that fetch from the network.
rm -f "$work/rootfs/etc/machine-id"; : >"$work/rootfs/etc/machine-id"
for u in getty@tty1.service apt-daily.timer apt-daily-upgrade.timer e2scrub_reap.service systemd-timesyncd.service; do
  ln -sf /dev/null "$work/rootfs/etc/systemd/system/$u"
done
# sshd: every container makes its own host keys at first start (none baked into the image), and sshd starts
# only in a container that is given /etc/ssh/sshd_config.d/modelfleet-listen.conf (its address and port:
# scenarios run on the host network, where port 22 is not theirs); without that file ssh.service is
# skipped by its condition, not failed.
rm -f "$work/rootfs/etc/ssh/ssh_host_"*
mkdir -p "$work/rootfs/etc/systemd/system/ssh.service.d"
cat >"$work/rootfs/etc/systemd/system/ssh.service.d/modelfleet.conf" <<'UNIT'
[Unit]
ConditionPathExists=/etc/ssh/sshd_config.d/modelfleet-listen.conf
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
UNIT
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
tar -C "$work/rootfs" -c . | podman import --change 'CMD ["/sbin/init"]' --change 'STOPSIGNAL SIGRTMIN+3' - "$tag" >/dev/null
podman tag "$tag" "$name:latest"
echo "$tag"
