#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts the overload contract of the staging path: with every byte staged
# through a small fixed pool (8 MiB), a slow link, and ~60x more data
# offered at once than the pool holds, kvproxyd — inside a memory cgroup
# capped just above its configured memory — is never OOM-killed; every
# transfer ends ok or with "no-buffers"/"timeout"; what landed is verified;
# the pool is whole again afterwards; and the node keeps serving.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

SIZE=536870912
# Pools: 8 MiB staging plus transfer/frame tables, all from the EAL heap
# (-m 256 is address space, faulted in only as used); the rest is fixed
# overhead. Measured peaks: ~20 MiB plain, ~35 MiB under ASan.
CAP=$((128 * 1048576))

require_netns
require_bins
init_test
memcg_create "$CAP"
netns_pair 51
KVP_TIMEOUTS_EXTRA="admission_ms = 300;"
KVP_PEER_MS=5000 # a throttled, saturated link is slow, not dead
STAGE='stage = { host = true; pool = 8388608; buffer = 1048576; };'
write_conf prefill0 "$ADDR_P:7400" decode0 "$ADDR_D:7400" "$STAGE"
write_conf decode0 "$ADDR_D:7400" prefill0 "$ADDR_P:7400" "$STAGE"
start_daemon_in_memcg prefill0 "$NS_P"
start_daemon decode0 "$NS_D"
wait_admin prefill0
wait_admin decode0
wait_peer_up prefill0 decode0
wait_peer_up decode0 prefill0
ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate 200mbit burst 256kb latency 50ms ||
	setup_fail "tc tbf unavailable"

STOP="$KVP_TMP/stop"
spawn "$NS_D" "$KVP_TMP/decode.out" "$KVP_TMP/decode.err" "$KVPROXY_BENCH" decode \
	-s "$(sock_of decode0)" --size "$SIZE" --seed 9 --key-file "$KVP_TMP/key" \
	--min-seg 4194304 --max-seg 4194304 --segs-per-xfer 4 --timeout 300 --stop-file "$STOP" --json
DEC=$SPAWNED
rc=0
in_ns "$NS_P" "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KVP_TMP/key" --size "$SIZE" --seed 9 --min-seg 4194304 --max-seg 4194304 \
	--segs-per-xfer 4 --inflight 32 --timeout-ms 20000 --wait-key 60 --json \
	>"$KVP_TMP/prefill.json" 2>"$KVP_TMP/prefill.err" || rc=$?
cat "$KVP_TMP/prefill.err" >&2
[[ $rc -le 1 ]] || fail "prefill client exit $rc"
json_check "$KVP_TMP/prefill.json" \
	"d['status']['ok'] + d['status']['no-buffers'] + d['status']['timeout'] == d['xfers']" \
	"every transfer must end ok, no-buffers or timeout"
json_check "$KVP_TMP/prefill.json" "d['status']['no-buffers'] > 0" \
	"the overload must have produced no-buffers failures"
json_check "$KVP_TMP/prefill.json" "d['status']['ok'] > 0" "some transfers must still get through"
OK=$(json_get "$KVP_TMP/prefill.json" "d['status']['ok']")
log "prefill: $OK ok, $(json_get "$KVP_TMP/prefill.json" "d['status']['no-buffers']") no-buffers"

# Once every acknowledged transfer has landed, the decode client verifies them.
wait_json decode0 stats "d['totals']['xfers_landed'] >= $OK" 60 "decode0 landed the $OK ok transfers"
touch "$STOP"
wait_pid "$DEC" 60 || fail "decode client: $(cat "$KVP_TMP/decode.err")"
json_check "$KVP_TMP/decode.out" "d['mismatches'] == 0 and d['xfers'] >= $OK" \
	"every landed transfer must verify"

# Bounded memory, nothing leaked, pool whole again.
for n in prefill0 decode0; do
	wait_json "$n" stats "d['staging']['in_use'] == 0 and d['totals']['inflight'] == 0" 30 \
		"$n: staging pool full again and nothing in flight"
done
stats_json prefill0 >"$KVP_TMP/p.stats"
json_check "$KVP_TMP/p.stats" "d['staging']['high_water'] <= d['staging']['buffers'] and d['staging']['waits'] > 0" \
	"prefill0: the pool must have run dry and never grown"
json_check "$KVP_TMP/p.stats" "d['staging']['registered_buffers'] > 0" \
	"prefill0: receive buffers registered with io_uring (tcp.fixed_buffers)"
[[ $(memcg_ooms) -eq 0 ]] || fail "kvproxyd was OOM-killed in its memory cgroup"
daemon_alive prefill0 || fail "prefill0 died under overload"
log "memory cgroup peak $(memcg_peak) of $CAP bytes; no OOM kill"

# The node keeps serving: a modest transfer now succeeds.
ip netns exec "$NS_P" tc qdisc del dev "$VETH_P" root
spawn "$NS_D" "$KVP_TMP/decode2.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
	--size 16777216 --seed 10 --key-file "$KVP_TMP/key2" --timeout 60
DEC=$SPAWNED
in_ns "$NS_P" "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KVP_TMP/key2" --size 16777216 --seed 10 --wait-key 30 ||
	fail "transfer after the overload failed"
wait_pid "$DEC" 60 || fail "decode client did not verify the transfer after the overload"
stop_daemon_checked prefill0
stop_daemon_checked decode0
