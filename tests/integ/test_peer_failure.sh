#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts the peer-failure contract: when the decode node dies (kill -9) or
# its link goes down in the middle of large transfers, every transfer on the
# prefill side ends with a peer error within the peer timeout (plus slack),
# long before its 30 s deadline; nothing stays in flight; and once the peer
# is back, transfers succeed again. Argument "zerocopy": with tcp.zerocopy,
# where sent frames wait for the kernel's notifications when the link dies.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

SIZE=536870912
PEER_MS=1000
SLACK_S=4 # scheduling slack on a loaded 2-core machine

require_netns
require_bins
zerocopy_variant "${1:-}"
init_test
start_pair 21 "$CONF"
# Slow the link so the transfers are certainly in flight when the fault hits.
ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate 400mbit burst 256kb latency 100ms ||
	setup_fail "tc tbf is needed to keep transfers in flight"

# big_transfer TAG: decode + prefill clients in the background; PRE/DEC pids.
big_transfer() {
	local tag=$1
	spawn "$NS_D" "$KVP_TMP/decode.$tag.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
		--size "$SIZE" --seed 5 --key-file "$KVP_TMP/key.$tag" --timeout 120
	DEC=$SPAWNED
	spawn "$NS_P" "$KVP_TMP/prefill.$tag.out" "$KVP_TMP/prefill.$tag.err" "$KVPROXY_BENCH" prefill \
		-s "$(sock_of prefill0)" --peer decode0 --key-file "$KVP_TMP/key.$tag" --size "$SIZE" \
		--seed 5 --min-seg 1048576 --max-seg 8388608 --wait-key 60 --json
	PRE=$SPAWNED
	wait_json prefill0 stats "peer('decode0')['tx_bytes'] >= $(( $(json_tx) + 16 * 1048576 ))" 60 \
		"transfer $tag moving (16 MiB on the wire)"
}

json_tx() {
	stats_json prefill0 >"$KVP_TMP/tx.json" 2>/dev/null && json_get "$KVP_TMP/tx.json" "peer('decode0')['tx_bytes']" || echo 0
}

# expect_peer_failures TAG T0: the prefill client ended within the bound, with
# only peer errors (or successes), and the node holds nothing in flight.
expect_peer_failures() {
	local tag=$1 t0=$2 rc=0 elapsed
	wait_pid "$PRE" 60 || rc=$?
	elapsed=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
	log "$tag: prefill client ended $elapsed s after the fault (exit $rc)"
	[[ $rc -eq 1 ]] || fail "$tag: prefill client exit $rc, expected 1 (failed transfers)"
	awk -v e="$elapsed" -v b="$((PEER_MS / 1000 + SLACK_S))" 'BEGIN { exit !(e <= b) }' ||
		fail "$tag: failures took $elapsed s, more than peer_ms + ${SLACK_S}s"
	json_check "$KVP_TMP/prefill.$tag.out" \
		"d['status']['peer'] > 0 and d['status']['ok'] + d['status']['peer'] == d['xfers']" \
		"$tag: transfers must end ok or with a peer error"
	wait_json prefill0 status 'd["inflight"] == 0' 10 "$tag: no transfer left in flight"
}

# 1. kill -9 of the decode node.
big_transfer kill
T0=$(now)
kill -KILL "${DPID[decode0]}"
untrack "${DPID[decode0]}"
wait "${DPID[decode0]}" 2>/dev/null || true
expect_peer_failures kill "$T0"
wait_pid "$DEC" 30 || true # its daemon is gone: it fails, as it should
wait_json prefill0 peers "d['peers'][0]['state'] != 'up'" 10 "prefill0 sees decode0 down"

# 2. The decode node comes back: reconnect, and a fresh transfer is verified.
start_daemon decode0 "$NS_D"
wait_admin decode0
wait_peer_up prefill0 decode0 30
wait_peer_up decode0 prefill0 30
spawn "$NS_D" "$KVP_TMP/decode.again.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
	--size 67108864 --seed 6 --key-file "$KVP_TMP/key.again" --timeout 120
DEC=$SPAWNED
in_ns "$NS_P" "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KVP_TMP/key.again" --size 67108864 --seed 6 --wait-key 60 ||
	fail "transfer after the decode node restarted failed"
wait_pid "$DEC" 60 || fail "decode client did not verify the transfer after the restart"

# 3. Link down (no RST reaches anyone: only heartbeats can tell), then up.
big_transfer linkdown
T0=$(now)
ip -n "$NS_P" link set "$VETH_P" down
expect_peer_failures linkdown "$T0"
# Its transfers never land; it would wait for its own timeout, so stop it.
stop_pid "$DEC" 5 || true
untrack "$DEC"
ip -n "$NS_P" link set "$VETH_P" up
wait_peer_up prefill0 decode0 30
wait_peer_up decode0 prefill0 30
spawn "$NS_D" "$KVP_TMP/decode.up.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
	--size 67108864 --seed 7 --key-file "$KVP_TMP/key.up" --timeout 120
DEC=$SPAWNED
in_ns "$NS_P" "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KVP_TMP/key.up" --size 67108864 --seed 7 --wait-key 60 ||
	fail "transfer after the link came back failed"
wait_pid "$DEC" 60 || fail "decode client did not verify the transfer after the link came back"

stats_json prefill0 >"$KVP_TMP/p.stats"
json_check "$KVP_TMP/p.stats" "peer('decode0')['disconnects'] >= 2 and peer('decode0')['connects'] >= 3" \
	"prefill0 must count the two losses and the reconnects"
stop_daemon_checked prefill0
stop_daemon_checked decode0
