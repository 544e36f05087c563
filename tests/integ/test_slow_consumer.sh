#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts back-pressure from a stalled decode node: its kvproxyd is frozen
# (SIGSTOP) for a second in the middle of staged transfers. The sender must
# not grow (its staging pool stays within its fixed size, transfers wait),
# and once the decode node runs again every transfer completes with every
# byte verified and both pools are whole again.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

SIZE=268435456
require_netns
require_bins
init_test
KVP_PEER_MS=5000 # the stall is shorter than this: it is slowness, not death
KVP_TIMEOUTS_EXTRA="admission_ms = 60000;"
start_pair 61 'stage = { host = true; pool = 16777216; buffer = 1048576; };'
ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate 800mbit burst 256kb latency 50ms ||
	setup_fail "tc tbf unavailable"

spawn "$NS_D" "$KVP_TMP/decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
	--size "$SIZE" --seed 12 --key-file "$KVP_TMP/key" --timeout 300
DEC=$SPAWNED
spawn "$NS_P" "$KVP_TMP/prefill.json" "$KVP_TMP/prefill.err" "$KVPROXY_BENCH" prefill \
	-s "$(sock_of prefill0)" --peer decode0 --key-file "$KVP_TMP/key" --size "$SIZE" --seed 12 \
	--inflight 16 --timeout-ms 120000 --wait-key 60 --json
PRE=$SPAWNED
wait_json prefill0 stats "peer('decode0')['tx_bytes'] >= 33554432" 60 "transfers moving"

stats_json prefill0 >"$KVP_TMP/before.json"
W0=$(json_get "$KVP_TMP/before.json" "d['staging']['waits']")
B0=$(json_get "$KVP_TMP/before.json" "peer('decode0')['tx_bytes']")
kill -STOP "${DPID[decode0]}"
log "decode0 frozen"
# While it is frozen the sender fills its window and pushes back: the pool
# it stages into is used up to its fixed size, never beyond.
wait_json prefill0 stats "d['staging']['waits'] > $W0 and peer('decode0')['tx_bytes'] > $B0" 30 \
	"prefill0 keeps sending into the socket, then waits for staging buffers"
stats_json prefill0 >"$KVP_TMP/frozen.json"
json_check "$KVP_TMP/frozen.json" "d['staging']['in_use'] <= d['staging']['buffers']" \
	"prefill0 staging beyond its pool"
kill -CONT "${DPID[decode0]}"
log "decode0 running again"

wait_pid "$PRE" 240 || fail "prefill client failed after the stall: $(cat "$KVP_TMP/prefill.err")"
wait_pid "$DEC" 120 || fail "decode client did not verify the data: $(cat "$KVP_TMP/decode.out")"
json_check "$KVP_TMP/prefill.json" "d['status']['ok'] == d['xfers']" "every transfer must complete ok"
for n in prefill0 decode0; do
	wait_json "$n" stats "d['staging']['in_use'] == 0 and d['totals']['inflight'] == 0" 30 \
		"$n: staging pool whole again"
done
stop_daemon_checked prefill0
stop_daemon_checked decode0
