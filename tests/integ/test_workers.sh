#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Two worker lcores per daemon (issue 19), prefill0 -> decode0 across two
# network namespaces, two clients per node; clients go to the worker with
# the fewest, so the first of each node sits on worker 0 and the second on
# worker 1 (checked through stats: clients[].worker).
#   cross  each prefill client sends to the decode client on the OTHER
#          worker: its bytes land through the links of its own worker's
#          namesake and the landing notices cross to the client's worker
#          (landings_forwarded > 0 on both decode workers); every byte of
#          both transfers verified, both nodes reclaim everything.
#   kill   (a) both worker-0 clients (prefill and decode) are killed -9
#          mid-transfer while the worker-1 pair's transfer goes on and
#          verifies every byte; (b) crossed pairs again, and the decode
#          client of worker 0 is killed mid-transfer: the pair whose bytes
#          land through worker 0's links for worker 1's client still
#          verifies every byte, the other prefill client ends with failures.
set -euo pipefail
export KVP_WORKERS=${KVP_WORKERS:-2}
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

CASE=${1:-cross}
KVP_TEST=test_workers_$CASE
[[ $KVP_WORKERS -ge 2 ]] || setup_fail "KVP_WORKERS=$KVP_WORKERS: this test needs two workers per daemon"

require_netns
require_bins
init_test
start_pair 19

# nclients NODE N: until NODE reports N clients.
nclients() {
	wait_json "$1" status "d['clients'] == $2" 30 "$2 client(s) connected"
}

# decode_client TAG SIZE SEED: a decode client in the background; sets SPAWNED.
decode_client() {
	spawn "$NS_D" "$KVP_TMP/$1.decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
		--size "$2" --seed "$3" --key-file "$KVP_TMP/$1.key" --timeout 300
	wait_file "$KVP_TMP/$1.key" 30 "$SPAWNED"
}

# prefill_client KEYTAG OUTTAG SIZE SEED: a prefill client sending to KEYTAG's
# region once go KEYTAG publishes the key where it waits for it (so that both
# prefill clients are connected before either sends).
prefill_client() {
	spawn "$NS_P" "$KVP_TMP/$2.prefill.out" - "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" \
		--peer decode0 --key-file "$KVP_TMP/$1.go" --size "$3" --seed "$4" --wait-key 60
}

go() {
	cp "$KVP_TMP/$1.key" "$KVP_TMP/$1.go.tmp"
	mv "$KVP_TMP/$1.go.tmp" "$KVP_TMP/$1.go"
}

# worker_of NODE PID: the worker that owns NODE's client of process PID.
worker_of() {
	stats_json "$1" >"$KVP_TMP/w.stats"
	json_get "$KVP_TMP/w.stats" "next(c['worker'] for c in d['clients'] if c['pid'] == $2)"
}

# expect_worker NODE PID W WHAT
expect_worker() {
	local w
	w=$(worker_of "$1" "$2")
	[[ $w == "$3" ]] || fail "$4 (pid $2) is on worker $w of $1, expected worker $3"
	log "$4 is on worker $3 of $1"
}

# verified TAG PID SIZE: the decode client TAG exits 0 having verified SIZE bytes.
verified() {
	local rc=0
	wait_pid "$2" 240 || rc=$?
	cat "$KVP_TMP/$1.decode.out" >&2
	[[ $rc -eq 0 ]] || fail "decode client $1 exited $rc"
	grep -q "decode: verified $3 bytes" "$KVP_TMP/$1.decode.out" ||
		fail "decode client $1 did not verify $3 bytes"
}

# sent_ok TAG PID: the prefill client TAG exits 0, every transfer ok.
sent_ok() {
	local rc=0
	wait_pid "$2" 240 || rc=$?
	cat "$KVP_TMP/$1.prefill.out" >&2
	[[ $rc -eq 0 ]] || fail "prefill client $1 exited $rc"
}

reclaimed() {
	wait_json "$1" status 'd["clients"] == 0 and d["regions"] == 0 and d["inflight"] == 0' 90 \
		"clients, regions and inflight back to 0 after $2"
	wait_json "$1" stats 'all(w["inflight"] == 0 and w["clients"] == 0 for w in d["workers"])' 30 \
		"every worker without clients or transfers after $2"
}

# Two decode clients (worker 0, then worker 1) and two prefill clients
# (worker 0, then worker 1); prefill 0 sends to decode KEY0, prefill 1 to KEY1.
# Sets D0 D1 P0 P1 (pids).
four_clients() {
	local tag=$1 size=$2 key0=$3 key1=$4
	decode_client "${tag}d0" "$size" 11
	D0=$SPAWNED
	nclients decode0 1
	decode_client "${tag}d1" "$size" 22
	D1=$SPAWNED
	nclients decode0 2
	expect_worker decode0 "$D0" 0 "decode client ${tag}d0"
	expect_worker decode0 "$D1" 1 "decode client ${tag}d1"
	local s0=11 s1=22
	[[ $key0 == "${tag}d1" ]] && s0=22
	[[ $key1 == "${tag}d0" ]] && s1=11
	prefill_client "$key0" "${tag}p0" "$size" "$s0"
	P0=$SPAWNED
	nclients prefill0 1
	prefill_client "$key1" "${tag}p1" "$size" "$s1"
	P1=$SPAWNED
	nclients prefill0 2
	expect_worker prefill0 "$P0" 0 "prefill client ${tag}p0"
	expect_worker prefill0 "$P1" 1 "prefill client ${tag}p1"
	go "$key0"
	go "$key1"
}

case $CASE in
cross)
	SIZE=$((128 * 1024 * 1024))
	four_clients x "$SIZE" xd1 xd0 # prefill worker 0 -> decode worker 1, and 1 -> 0
	sent_ok xp0 "$P0"
	sent_ok xp1 "$P1"
	verified xd1 "$D1" "$SIZE"
	verified xd0 "$D0" "$SIZE"
	stats_json decode0 >"$KVP_TMP/d.stats"
	json_check "$KVP_TMP/d.stats" "len(d['workers']) == 2" "decode0 does not report two workers"
	json_check "$KVP_TMP/d.stats" "all(w['landings_forwarded'] > 0 and w['xfers_landed'] > 0 for w in d['workers'])" \
		"decode0: landing notices did not cross between the workers both ways"
	json_check "$KVP_TMP/d.stats" "all(w['messages_lost'] == 0 for w in d['workers'])" \
		"decode0: cross-worker messages lost"
	json_check "$KVP_TMP/d.stats" "sum(w['xfers_landed'] for w in d['workers']) == d['totals']['xfers_landed']" \
		"decode0: per-worker landings do not add up to the total"
	stats_json prefill0 >"$KVP_TMP/p.stats"
	json_check "$KVP_TMP/p.stats" "all(w['tx_bytes'] >= $SIZE and w['links_up'] == 2 for w in d['workers'])" \
		"prefill0: each worker should have sent its client's bytes on two links of its own"
	json_check "$KVP_TMP/p.stats" "sum(v for k, v in d['completions'].items() if k != 'ok') == 0" \
		"prefill0: failed completions"
	log "both crossed pairs verified; notices crossed both ways on decode0"
	reclaimed prefill0 "the clients finished"
	reclaimed decode0 "the clients finished"
	# Idle workers block waiting for work: that time is idle, not busy
	# (issue 19: a blocked wait used to count as busy). A 1 s window of
	# measurement, not a wait for anything.
	stats_json decode0 >"$KVP_TMP/i0.stats"
	sleep 1
	stats_json decode0 >"$KVP_TMP/i1.stats"
	python3 - "$KVP_TMP/i0.stats" "$KVP_TMP/i1.stats" <<'PY' || fail "idle workers counted as busy"
import json, sys
a, b = (json.load(open(f))["workers"] for f in sys.argv[1:])
for i, (x, y) in enumerate(zip(a, b)):
    busy, idle = y["busy_ns"] - x["busy_ns"], y["idle_ns"] - x["idle_ns"]
    share = busy / (busy + idle) if busy + idle else 1
    print("worker %d idle for 1 s: busy %.1f %% (%d sleeps)" % (i, 100 * share, y["sleeps"] - x["sleeps"]),
          file=sys.stderr)
    if share > 0.2 or busy + idle < 0.5e9:
        sys.exit(1)
PY
	;;
kill)
	BIG=$((512 * 1024 * 1024))
	MOVING=$((16 * 1024 * 1024))
	# Slow the link so the transfers are still running when clients are killed.
	if ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate 600mbit burst 256kb latency 100ms 2>/dev/null; then
		log "link limited to 600 Mbit/s"
	else
		log "tc tbf unavailable; running unshaped"
	fi
	# (a) worker 0's clients die on both nodes; worker 1's pair goes on.
	four_clients a "$BIG" ad0 ad1
	wait_json prefill0 stats "d['workers'][0]['tx_bytes'] >= $MOVING and d['workers'][1]['tx_bytes'] >= $MOVING" 120 \
		"both prefill workers sending"
	kill9 "$P0" "prefill client ap0 (worker 0)"
	kill9 "$D0" "decode client ad0 (worker 0)"
	kill -0 "$P1" 2>/dev/null || setup_fail "prefill client ap1 finished before the kills"
	wait_json prefill0 stats "d['workers'][0]['clients'] == 0 and d['workers'][1]['clients'] == 1" 60 \
		"prefill0 worker 0 reclaimed its dead client, worker 1 keeps its own"
	wait_json decode0 stats "d['workers'][0]['clients'] == 0 and d['workers'][1]['clients'] == 1" 60 \
		"decode0 worker 0 reclaimed its dead client, worker 1 keeps its own"
	sent_ok ap1 "$P1"
	verified ad1 "$D1" "$BIG"
	log "(a) worker 1's pair verified every byte after worker 0's clients died"
	reclaimed prefill0 "(a)"
	reclaimed decode0 "(a)"
	# (b) crossed pairs; worker 0's decode client dies.
	SIZE=$((256 * 1024 * 1024))
	stats_json decode0 >"$KVP_TMP/b0.stats"
	RX0=$(json_get "$KVP_TMP/b0.stats" "d['workers'][0]['rx_bytes']")
	four_clients b "$SIZE" bd1 bd0 # prefill worker 0 -> decode client of worker 1, 1 -> 0
	wait_json decode0 stats "d['workers'][0]['rx_bytes'] >= $RX0 + $MOVING" 120 \
		"bytes landing through decode0 worker 0's links"
	kill9 "$D0" "decode client bd0 (worker 0)"
	rc=0
	wait_pid "$P1" 240 || rc=$?
	cat "$KVP_TMP/bp1.prefill.out" >&2
	[[ $rc -ne 0 ]] || log "note: prefill client bp1 finished before its destination died"
	sent_ok bp0 "$P0"
	verified bd1 "$D1" "$SIZE"
	stats_json decode0 >"$KVP_TMP/b.stats"
	json_check "$KVP_TMP/b.stats" "d['workers'][0]['landings_forwarded'] > 0" \
		"decode0 worker 0 should have forwarded landing notices to worker 1"
	log "(b) the pair landing through worker 0 for worker 1's client verified every byte"
	reclaimed prefill0 "(b)"
	reclaimed decode0 "(b)"
	;;
*)
	setup_fail "unknown case '$CASE' (cross, kill)"
	;;
esac
daemon_alive prefill0 || fail "prefill0 died"
daemon_alive decode0 || fail "decode0 died"
stop_daemon_checked prefill0
stop_daemon_checked decode0
