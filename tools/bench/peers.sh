#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark, not a test: peers at run time, each figure against a reference
# measured in the same run.
#
#   tools/bench/peers.sh [BUILD_DIR] [--reps N]
#
# On a bridge of three namespaces (prefill0, decode1, decode2):
#  - time from peer_add to the first byte landed at the peer (the receiver's
#    landing notice of a 64 KiB transfer submitted right after the add), and
#    from an on-demand lookup by address to the same; reference: the same
#    transfer to a peer already connected. The peer is removed (drained) and
#    a fresh receiver started between rounds; --reps rounds (5), median and max.
#  - CPU share of prefill0 over 20 s with 64 peers (63 unreachable, on the
#    subnet), reference: a node with the one live peer only, same window.
#  - RSS of idle nodes with limits.max_peers 8, 64, 256, and of one with
#    max_peers 256 after 64 peers were added, 2 of them live decode nodes.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$ROOT/build
REPS=5
while [[ $# -gt 0 ]]; do
	case $1 in
	--reps) REPS=$2; shift 2 ;;
	-h | --help) sed -n 3,17p "$0"; exit 0 ;;
	*) BUILD=$(cd "$1" && pwd); shift ;;
	esac
done
export KVPROXYD=$BUILD/app/kvproxyd KVPROXYCTL=$BUILD/tools/kvproxyctl/kvproxyctl
export KVPROXY_BENCH=$BUILD/tools/bench/kvproxy-bench
PEERS_CLIENT=$BUILD/tests/integ/peers_client
# Untouched allocations stay out of RSS only without glibc's perturbation.
unset MALLOC_PERTURB_

# shellcheck source=../../tests/integ/lib.sh
source "$ROOT/tests/integ/lib.sh"
KVP_TEST=bench_peers
require_netns
require_bins
[[ -x $PEERS_CLIENT ]] || setup_fail "$PEERS_CLIENT is missing (ninja -C $BUILD)"
init_test

# conf ID LISTEN MAX_PEERS PEERS
conf() {
	cat >"$KVP_TMP/$1.conf" <<EOF
node_id = "$1";
client_socket = "$KVP_TMP/$1.sock";
admin_socket = "$KVP_TMP/$1.admin";
listen = "$2";
auth = { secret = "bench-peers-secret"; };
timeouts = { peer_ms = 1000; reconnect_ms = 100; connect_ms = 1000; };
limits = { max_peers = $3; };
peers = ( $4 );
EOF
}
rss() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
maxof() { sort -n | tail -1; }

netns_bridge 93 3
conf prefill0 "${ADDR_NODE[0]}:7400" 8 ""
conf decode1 "${ADDR_NODE[1]}:7400" 8 ""
conf decode2 "${ADDR_NODE[2]}:7400" 8 ""
start_daemon prefill0 "${NS_NODE[0]}"
start_daemon decode1 "${NS_NODE[1]}"
start_daemon decode2 "${NS_NODE[2]}"
for n in prefill0 decode1 decode2; do wait_admin "$n"; done

# first MODE NODE NS ADDR: one round; prints the ms from the start to the landing.
first() {
	local mode=$1 node=$2 ns=$3 addr=$4 out t0 landed
	rm -f "$KVP_TMP/$node.stop" "$KVP_TMP/$node.status" "$KVP_TMP/$node.key"
	spawn "$ns" "$KVP_TMP/$node.dest.out" - "$PEERS_CLIENT" dest -s "$(sock_of "$node")" --size 1m \
		--xfer 64k --key-file "$KVP_TMP/$node.key" --status "$KVP_TMP/$node.status" --stop "$KVP_TMP/$node.stop"
	local dpid=$SPAWNED
	wait_file "$KVP_TMP/$node.status" 30 "$dpid"
	case $mode in
	add) out=$(in_ns "${NS_NODE[0]}" "$PEERS_CLIENT" first -s "$(sock_of prefill0)" --admin "$(admin_of prefill0)" \
		--add "$node" --peer "$addr" --key-file "$KVP_TMP/$node.key" --xfer 64k) ;;
	demand) out=$(in_ns "${NS_NODE[0]}" "$PEERS_CLIENT" first -s "$(sock_of prefill0)" --peer "$addr" \
		--key-file "$KVP_TMP/$node.key" --xfer 64k) ;;
	known) out=$(in_ns "${NS_NODE[0]}" "$PEERS_CLIENT" first -s "$(sock_of prefill0)" --peer "$node" \
		--key-file "$KVP_TMP/$node.key" --xfer 64k) ;;
	esac
	t0=$(awk '{ print $7 }' <<<"$out")
	local dl
	dl=$(deadline_in 10)
	until [[ $(awk '{ print $13 }' "$KVP_TMP/$node.status") -gt 0 ]]; do
		before "$dl" || fail "$node: nothing landed ($out)"
		sleep 0.01
	done
	landed=$(awk '{ print $13 }' "$KVP_TMP/$node.status")
	touch "$KVP_TMP/$node.stop"
	wait_pid "$dpid" 10 >/dev/null
	awk -v a="$t0" -v b="$landed" 'BEGIN { printf "%.3f\n", (b - a) / 1e6 }'
}

# gone NODE: until prefill0 has no peer NODE (drained, slot free).
gone() { wait_json prefill0 peers "not any(p['node_id'] == '$1' for p in d['peers'])" 20 "$1 drained"; }

for ((r = 0; r < REPS; r++)); do
	first add decode1 "${NS_NODE[1]}" "${ADDR_NODE[1]}:7400" >>"$KVP_TMP/t.add"
	first known decode1 "${NS_NODE[1]}" "" >>"$KVP_TMP/t.known"
	ctl prefill0 peer remove decode1 >/dev/null
	gone decode1
	first demand decode2 "${NS_NODE[2]}" "${ADDR_NODE[2]}:7400" >>"$KVP_TMP/t.demand"
	ctl prefill0 peer remove "${ADDR_NODE[2]}:7400" >/dev/null
	gone decode2
done
for s in add demand known; do
	log "first byte landed after $s: median $(median <"$KVP_TMP/t.$s") ms, max $(maxof <"$KVP_TMP/t.$s") ms ($REPS rounds; samples $(tr '\n' ' ' <"$KVP_TMP/t.$s"))"
done
stop_daemon_checked prefill0

# CPU: 64 peers (63 unreachable) against one peer, same 20 s window, both at once.
list="{ node_id = \"decode1\"; addr = \"${ADDR_NODE[1]}:7400\"; }"
for ((i = 1; i <= 63; i++)); do
	list+=", { node_id = \"ghost$i\"; addr = \"10.77.93.$((100 + i)):7400\"; }"
done
conf p64 "${ADDR_NODE[0]}:7401" 64 "$list"
conf p1 "${ADDR_NODE[0]}:7402" 64 "{ node_id = \"decode1\"; addr = \"${ADDR_NODE[1]}:7400\"; }"
start_daemon p64 "${NS_NODE[0]}"
start_daemon p1 "${NS_NODE[0]}"
wait_admin p64
wait_admin p1
wait_peer_up p64 decode1
wait_peer_up p1 decode1
hz=$(getconf CLK_TCK)
a64=$(ticks "${DPID[p64]}")
a1=$(ticks "${DPID[p1]}")
sleep 20
b64=$(ticks "${DPID[p64]}")
b1=$(ticks "${DPID[p1]}")
log "CPU over 20 s: 64 peers (63 unreachable) $(awk -v a="$a64" -v b="$b64" -v h="$hz" 'BEGIN { printf "%.2f", 100 * (b - a) / h / 20 }') % of one CPU; reference, 1 peer: $(awk -v a="$a1" -v b="$b1" -v h="$hz" 'BEGIN { printf "%.2f", 100 * (b - a) / h / 20 }') %"
log "RSS: 64 peers $(rss "${DPID[p64]}") KiB, 1 peer $(rss "${DPID[p1]}") KiB (both limits.max_peers 64)"
stop_daemon_checked p64
stop_daemon_checked p1

# RSS: idle nodes by max_peers, then 64 peers added to the 256 one (2 of them live).
conf m8 "${ADDR_NODE[0]}:7411" 8 ""
conf m64 "${ADDR_NODE[0]}:7412" 64 ""
conf m256 "${ADDR_NODE[0]}:7413" 256 ""
for n in m8 m64 m256; do start_daemon "$n" "${NS_NODE[0]}"; done
for n in m8 m64 m256; do wait_admin "$n"; done
log "idle RSS: max_peers 8 $(rss "${DPID[m8]}") KiB, 64 $(rss "${DPID[m64]}") KiB, 256 $(rss "${DPID[m256]}") KiB; VmSize 256 $(awk '/^VmSize/ { print $2 }' "/proc/${DPID[m256]}/status") KiB"
ctl m256 peer add decode1 "${ADDR_NODE[1]}:7400" >/dev/null
ctl m256 peer add decode2 "${ADDR_NODE[2]}:7400" >/dev/null
for ((i = 1; i <= 62; i++)); do
	ctl m256 peer add "ghost$i" "10.77.93.$((100 + i)):7400" >/dev/null
done
wait_peer_up m256 decode1
wait_peer_up m256 decode2
log "RSS with max_peers 256 and 64 peers added (2 up): $(rss "${DPID[m256]}") KiB"
for n in m8 m64 m256 decode1 decode2; do stop_daemon_checked "$n"; done
