#!/usr/bin/env bash
# An emulated network for distribution runs (issue 23): N lightweight hosts (systemd containers of the host
# image, no vLLM), each in its own network namespace behind a rate-limited link (tc tbf, both directions) into
# one switch (a bridge in its own namespace); the controller joins the switch by a link of the same rate. Hosts
# are reached over SSH on their own addresses (10.77.0.11, .12, ...; port 22), as real fleets are, and reach
# each other the same way. netem does not exist on this kernel: links have a rate, no added delay.
# NETFLEET_QUEUE=acks-first (default) or fifo chooses how a link queues (shape, below).
#   scripts/netfleet.sh up N RATE_MBIT    create them (re-creates what exists)
#   scripts/netfleet.sh inventory         an Ansible inventory (YAML) of the hosts that are up
#   scripts/netfleet.sh down              remove them
#   scripts/netfleet.sh shape NETNS DEV RATE_MBIT   limit one interface's egress as a link of the fleet is
#                                         (NETNS - for this one; benchmarks/bench_link_queue.py uses it)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}
die() { echo "netfleet.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (network namespaces and podman)"
prefix=mfnet sw=mfnet-sw net=10.77.0 ctl_if=mfnet-c

down() {
  local c n
  for c in $(podman ps -a --format '{{.Names}}' | grep -E "^$prefix-h[0-9]+$" || true); do podman rm -f "$c" >/dev/null; done
  for n in $(ip netns list | awk '{print $1}' | grep -E "^$prefix-" || true); do ip netns delete "$n"; done
  ip link delete "$ctl_if" 2>/dev/null || true
  rm -rf "$root/.cache/netfleet"
}

# The egress of one interface, limited to the link's rate. Two ways to queue what waits for the link:
#   acks-first (default): htb at the rate, TCP packets under 128 bytes (acknowledgements, the small requests of an
#     exchange) served before the bulk, each kind in a drop-tail queue of 50 ms of the rate. htb takes or refuses
#     TCP's large (GSO) packets whole, as a NIC's queue does, and a host's download's acknowledgements do not wait
#     behind its own upload, as with fq_codel or fq (sparse flows first), which this kernel does not build.
#   fifo: tbf, one drop-tail queue of 50 ms for everything (the emulation until 2026-12-08). tbf cuts packets
#     larger than its burst into segments and drops some of them when full, which TCP learns only as a loss, and
#     acknowledgements wait behind the bulk: a chain of 8 retransmitted 0.1-23% per host (docs/fetch.md, "The
#     links' queue"; benchmarks/bench_link_queue.py compares the two on one link).
# Both take bursts of 10 ms of the rate (at least 32 KiB); acks-first's queues hold at least 128 KiB.
queue=${NETFLEET_QUEUE:-acks-first}
check_queue() {
  case "$queue" in acks-first|fifo) ;; *) die "NETFLEET_QUEUE=$queue: use acks-first (the default) or fifo" ;; esac
}
shape() {  # netns ('' for this one) interface rate_mbit
  local ns=$1 dev=$2 rate=$3 burst limit small
  local -a tc=(tc); [ -n "$ns" ] && tc=(ip netns exec "$ns" tc)
  burst=$(( rate * 1000000 / 8 / 100 ))
  [ "$burst" -lt 32768 ] && burst=32768
  "${tc[@]}" qdisc del dev "$dev" root 2>/dev/null || true
  if [ "$queue" = fifo ]; then
    "${tc[@]}" qdisc add dev "$dev" root tbf rate "${rate}mbit" burst "$burst" latency 50ms
    return
  fi
  # 50 ms of the rate, in bytes, and at least two of TCP's largest (GSO) packets: htb queues them whole, and a queue
  # that cannot hold one refuses it every time (a flow at 8 Mbit/s, 50 KB of queue, stalled at 2 Mbit/s)
  limit=$(( rate * 1000000 / 8 / 20 ))
  [ "$limit" -lt 131072 ] && limit=131072
  small=$(( rate * 1000 / 20 ))          # kbit/s the small packets are sure of (5%); both may take the whole rate
  "${tc[@]}" qdisc add dev "$dev" root handle 1: htb default 20
  "${tc[@]}" class add dev "$dev" parent 1: classid 1:1 htb rate "${rate}mbit" ceil "${rate}mbit" burst "$burst" cburst "$burst" quantum 60000
  "${tc[@]}" class add dev "$dev" parent 1:1 classid 1:10 htb rate "${small}kbit" ceil "${rate}mbit" burst "$burst" cburst "$burst" prio 0 quantum 60000
  "${tc[@]}" class add dev "$dev" parent 1:1 classid 1:20 htb rate "$(( rate * 1000 - small ))kbit" ceil "${rate}mbit" burst "$burst" cburst "$burst" prio 1 quantum 60000
  "${tc[@]}" qdisc add dev "$dev" parent 1:10 bfifo limit "$limit"
  "${tc[@]}" qdisc add dev "$dev" parent 1:20 bfifo limit "$limit"
  # IPv4, TCP, total length below 128 bytes (the length field's high bits clear)
  "${tc[@]}" filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
    match ip protocol 6 0xff match u16 0x0000 0xff80 at 2 flowid 1:10
}

case "$cmd" in
  up)
    n=${2:-} rate=${3:-}
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 32 ] || die "give the number of hosts (1-32): up N RATE_MBIT"
    [[ "$rate" =~ ^[0-9]+$ ]] && [ "$rate" -ge 1 ] || die "give the link rate in Mbit/s: up N RATE_MBIT"
    check_queue
    key="$root/.cache/ssh/id_ed25519"
    [ -s "$key.pub" ] || die "the harness SSH key is missing ($key.pub); run scripts/setup.sh"
    image=$("$root/images/host/build.sh")
    down
    mkdir -p "$root/.cache/netfleet"
    ip netns add "$sw"
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    # the controller's link
    ip link add "$ctl_if" type veth peer name c0 netns "$sw"
    ip addr add "$net.1/24" dev "$ctl_if"
    ip link set "$ctl_if" up
    ip -n "$sw" link set c0 master br0 up
    shape "" "$ctl_if" "$rate"
    shape "$sw" c0 "$rate"
    printf '%s\n' "# sshd of the emulated fleet's hosts (scripts/netfleet.sh): the harness key for root; the keys" \
      "# peer distribution gives its transfer user for one transfer" \
      "PasswordAuthentication no" "KbdInteractiveAuthentication no" "PermitRootLogin prohibit-password" \
      "AuthorizedKeysFile /etc/ssh/modelfleet-authorized-keys .ssh/authorized_keys" >"$root/.cache/netfleet/sshd.conf"
    for i in $(seq 1 "$n"); do
      h="$prefix-h$i" addr="$net.$((10 + i))"
      ip netns add "$h"
      ip -n "$h" link set lo up
      ip link add "h$i" netns "$h" type veth peer name "p$i" netns "$sw"
      ip -n "$h" addr add "$addr/24" dev "h$i"
      ip -n "$h" link set "h$i" up
      ip -n "$sw" link set "p$i" master br0 up
      shape "$h" "h$i" "$rate"    # the host's upload
      shape "$sw" "p$i" "$rate"   # its download
      podman run -d --name "$h" --hostname "$h" --label modelfleet.fleet=netfleet --runtime runc --systemd=always \
        --cap-add SYS_ADMIN --network "ns:/run/netns/$h" \
        -v "$key.pub:/etc/ssh/modelfleet-authorized-keys:ro" \
        -v "$root/.cache/netfleet/sshd.conf:/etc/ssh/sshd_config.d/modelfleet-listen.conf:ro" \
        "$image" /sbin/init >/dev/null
      echo "$h $addr" >>"$root/.cache/netfleet/hosts"
    done
    echo "$rate" >"$root/.cache/netfleet/rate_mbit"
    for i in $(seq 1 "$n"); do  # sshd up on each
      for _ in $(seq 1 120); do
        timeout 2 bash -c "exec 3<>/dev/tcp/$net.$((10 + i))/22" 2>/dev/null && break
        sleep 0.5
      done || die "$prefix-h$i: sshd did not answer on $net.$((10 + i)):22"
    done
    echo "netfleet: $n hosts at $rate Mbit/s each way ($queue queues), controller $net.1 on $ctl_if"
    ;;
  inventory)
    [ -s "$root/.cache/netfleet/hosts" ] || die "no emulated fleet is up (scripts/netfleet.sh up N RATE_MBIT)"
    echo "all:"
    echo "  vars:"
    echo "    ansible_user: root"
    echo "    ansible_ssh_private_key_file: $root/.cache/ssh/id_ed25519"
    echo "    ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    echo "    ansible_ssh_pipelining: true"
    echo "  hosts:"
    while read -r h addr; do echo "    $h: {ansible_host: $addr}"; done <"$root/.cache/netfleet/hosts"
    ;;
  down) down ;;
  shape)
    [ $# -eq 4 ] && [[ "$4" =~ ^[0-9]+$ ]] && [ "$4" -ge 1 ] || die "usage: scripts/netfleet.sh shape NETNS DEV RATE_MBIT"
    check_queue
    ns=$2; [ "$ns" = - ] && ns=
    shape "$ns" "$3" "$4"
    ;;
  *) die "usage: scripts/netfleet.sh up N RATE_MBIT | inventory | down | shape NETNS DEV RATE_MBIT" ;;
esac
