#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts: when a client is killed (-9) mid-transfer — first the prefill
# client, then the decode client — its node reclaims its channel, regions and
# transfers (clients/regions/inflight back to 0), both daemons stay up, and a
# fresh prefill/decode pair then moves data with every byte verified.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

BIG=$((1024 * 1024 * 1024))
SMALL=$((64 * 1024 * 1024))
MOVING=$((16 * 1024 * 1024)) # bytes seen on the wire before a kill

require_netns
require_bins
init_test
start_pair 13

# Slow the link so the big transfer is still running when we kill a client.
# Without tbf (no sch_tbf) the transfer is just faster; the kill checks below
# notice if it finished first.
if ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate 400mbit burst 256kb latency 100ms 2>/dev/null; then
	log "link limited to 400 Mbit/s"
	SHAPED=1
else
	log "tc tbf unavailable; running unshaped"
	SHAPED=0
fi


# start_clients TAG SIZE SEED: background decode and prefill clients; sets DEC, PRE.
start_clients() {
	local tag=$1 size=$2 seed=$3 key="$KVP_TMP/$1.key"
	spawn "$NS_D" "$KVP_TMP/$tag.decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
		--size "$size" --seed "$seed" --key-file "$key" --timeout 400
	DEC=$SPAWNED
	spawn "$NS_P" "$KVP_TMP/$tag.prefill.out" - "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" \
		--peer decode0 --key-file "$key" --size "$size" --seed "$seed" --wait-key 60
	PRE=$SPAWNED
}

reclaimed() {
	wait_json "$1" status 'd["clients"] == 0 and d["regions"] == 0 and d["inflight"] == 0' 90 \
		"clients, regions and inflight back to 0 after $2"
	wait_json "$1" stats 'd["clients"] == [] and d["totals"].get("inflight", 0) == 0' 30 \
		"stats: no clients and nothing in flight after $2"
	log "$1 reclaimed everything after $2"
}

# ---- 1: the prefill client dies mid-transfer ----
start_clients one "$BIG" 101
wait_json prefill0 stats "peer('decode0')['tx_bytes'] >= $MOVING" 120 "bytes moving to decode0"
kill9 "$PRE" "prefill client"
reclaimed prefill0 "the prefill client died"
stop_pid "$DEC" 15 || true # it waits for bytes that will never come
untrack "$DEC"
reclaimed decode0 "the decode client was stopped"
daemon_alive prefill0 || fail "prefill0 died"
daemon_alive decode0 || fail "decode0 died"

# ---- 2: the decode client dies while data is landing ----
stats_json decode0 >"$KVP_TMP/d0.stats"
RX0=$(json_get "$KVP_TMP/d0.stats" "peer('prefill0')['rx_bytes']")
start_clients two "$BIG" 202
wait_json decode0 stats "peer('prefill0')['rx_bytes'] >= $RX0 + $MOVING" 120 "bytes landing from prefill0"
kill9 "$DEC" "decode client"
reclaimed decode0 "the decode client died"
# The prefill client's remaining transfers now fail (their destination region
# is gone) instead of hanging: it must finish on its own, reporting failures.
rc=0
wait_pid "$PRE" 300 || rc=$?
cat "$KVP_TMP/two.prefill.out" >&2
[[ $rc -ne 0 ]] || log "note: the prefill client finished everything before the kill took effect"
grep -Eq 'failures by status:( [a-z-]+=[0-9]+)+' "$KVP_TMP/two.prefill.out" || [[ $rc -eq 0 ]] ||
	fail "prefill client exited $rc without reporting failed transfers"
reclaimed prefill0 "the prefill client finished"
daemon_alive prefill0 || fail "prefill0 died"
daemon_alive decode0 || fail "decode0 died"

# ---- 3: a fresh pair still works, every byte verified ----
if [[ $SHAPED -eq 1 ]]; then
	ip netns exec "$NS_P" tc qdisc del dev "$VETH_P" root
fi
wait_peer_up prefill0 decode0
wait_peer_up decode0 prefill0
start_clients three "$SMALL" 303
rc=0
wait_pid "$PRE" 300 || rc=$?
cat "$KVP_TMP/three.prefill.out" >&2
[[ $rc -eq 0 ]] || fail "fresh prefill client exited $rc"
rc=0
wait_pid "$DEC" 120 || rc=$?
cat "$KVP_TMP/three.decode.out" >&2
[[ $rc -eq 0 ]] || fail "fresh decode client exited $rc"
grep -q "decode: verified $SMALL bytes" "$KVP_TMP/three.decode.out" ||
	fail "decode client did not report $SMALL verified bytes"

reclaimed prefill0 "the fresh pair finished"
reclaimed decode0 "the fresh pair finished"
stop_daemon_checked prefill0
stop_daemon_checked decode0
