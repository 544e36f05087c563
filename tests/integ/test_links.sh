#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts several TCP connections (links) per peer: prefill0 asks for 4,
# decode0 accepts 2, so both keep 2 each way; transfers spread over both
# links (per-link bytes add up to the peer's); one link killed under the
# daemons (ss -K) is redialled while the other stays up, and data verifies
# afterwards; a peer restarted with one connection brings the other side
# down to one link.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

SIZE=$((128 << 20))

require_netns
require_bins
command -v ss >/dev/null || setup_fail "ss (iproute2) is not installed"
init_test
netns_pair 47
write_conf prefill0 "$ADDR_P:7400" decode0 "$ADDR_D:7400" 'tcp = { connections = 4; };'
write_conf decode0 "$ADDR_D:7400" prefill0 "$ADDR_P:7400" 'tcp = { connections = 2; };'
up_pair "$NS_P" "$NS_D"

ctl prefill0 --json peers >"$KVP_TMP/p.peers"
ctl decode0 --json peers >"$KVP_TMP/d.peers"
json_check "$KVP_TMP/p.peers" "peer('decode0')['links'] == 2 and peer('decode0')['links_up'] == 2" \
	"prefill0 (4 connections) keeps the 2 decode0 accepts"
json_check "$KVP_TMP/d.peers" "peer('prefill0')['inbound_links'] == 2 and peer('prefill0')['links_up'] == 2" \
	"decode0 has 2 links each way"
n=$(in_ns "$NS_P" ss -Htn state established dst "$ADDR_D" dport = 7400 | wc -l)
[[ $n -eq 2 ]] || fail "prefill0 has $n established connections to decode0, expected 2"
log "2 links each way (prefill0 asked for 4)"

# verified SEED: one verified run of $SIZE bytes, 64 transfers of two 1 MiB segments.
verified() {
	local key="$KVP_TMP/key.$1" dec rc=0
	spawn "$NS_D" "$KVP_TMP/decode.$1.out" "$KVP_TMP/decode.$1.err" "$KVPROXY_BENCH" decode \
		-s "$(sock_of decode0)" --size "$SIZE" --seed "$1" --key-file "$key" \
		--min-seg 1048576 --max-seg 1048576 --segs-per-xfer 2 --timeout 120 --json
	dec=$SPAWNED
	in_ns "$NS_P" timeout 150 "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
		--key-file "$key" --size "$SIZE" --seed "$1" --min-seg 1048576 --max-seg 1048576 \
		--segs-per-xfer 2 --inflight 8 --wait-key 30 --json >"$KVP_TMP/prefill.$1.json" || rc=$?
	[[ $rc -eq 0 ]] || fail "prefill run $1 failed ($rc): $(cat "$KVP_TMP/prefill.$1.json")"
	wait_pid "$dec" 60 || fail "decode client did not verify run $1: $(cat "$KVP_TMP/decode.$1.err")"
	json_check "$KVP_TMP/decode.$1.out" "d['mismatches'] == 0 and d['bytes'] == $SIZE and d['xfers'] == 64" \
		"run $1: 64 transfers verified"
}

verified 1
stats_json prefill0 >"$KVP_TMP/p.stats"
json_check "$KVP_TMP/p.stats" "len(peer('decode0')['link_tx_bytes']) == 4 and \
all(b > 0 for b in peer('decode0')['link_tx_bytes'][:2]) and \
sum(peer('decode0')['link_tx_bytes']) == peer('decode0')['tx_bytes'] >= $SIZE" \
	"both links carry data and per-link bytes add up to the peer's"
log "per link: $(json_get "$KVP_TMP/p.stats" "peer('decode0')['link_tx_bytes']")"

# Kill one established link from under prefill0; the other stays up.
connects=$(json_get "$KVP_TMP/p.peers" "peer('decode0')['connects']")
sport=$(in_ns "$NS_P" ss -Htn state established dst "$ADDR_D" dport = 7400 | awk 'NR == 1 { n = split($3, a, ":"); print a[n] }')
[[ -n $sport ]] || setup_fail "no established link to kill"
in_ns "$NS_P" ss -K state established dst "$ADDR_D" dport = 7400 sport = "$sport" >/dev/null ||
	setup_fail "ss -K cannot kill sockets here (CONFIG_INET_DIAG_DESTROY)"
log "killed the link from port $sport"
wait_json prefill0 peers "peer('decode0')['disconnects'] >= 1 and peer('decode0')['connects'] > $connects and \
peer('decode0')['links_up'] == 2" 30 "prefill0 redials the killed link"
json_check "$KVP_TMP/p.peers" "peer('decode0')['state'] == 'up'" "the peer was up before the kill"
verified 2
log "killed link redialled, data verified again"

# decode0 restarted with one connection: prefill0 comes down to one link.
stop_daemon_checked decode0
write_conf decode0 "$ADDR_D:7400" prefill0 "$ADDR_P:7400" 'tcp = { connections = 1; };'
start_daemon decode0 "$NS_D"
wait_admin decode0
wait_peer_up prefill0 decode0
wait_peer_up decode0 prefill0
ctl prefill0 --json peers >"$KVP_TMP/p.peers"
json_check "$KVP_TMP/p.peers" "peer('decode0')['links'] == 1 and peer('decode0')['links_up'] == 1" \
	"prefill0 keeps the one link decode0 accepts"
n=$(in_ns "$NS_P" ss -Htn state established dst "$ADDR_D" dport = 7400 | wc -l)
[[ $n -eq 1 ]] || fail "prefill0 has $n established connections to decode0, expected 1"
verified 3
log "one link after decode0 restarted with tcp.connections = 1; data verified"

stop_daemon_checked prefill0
stop_daemon_checked decode0
