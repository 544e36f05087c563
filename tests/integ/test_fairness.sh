#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Fair admission under overload (issue 17), between two kvproxyd in two
# network namespaces, every byte staged through a small pool so that both
# transfer slots and staging buffers are scarce:
#
#   equal  six clients of one node, each keeping 16 transfers queued
#          against 16 transfer slots: until the first of them has all of
#          its transfers done, each has completed at least half of an
#          equal share (they take turns for slots and buffers); with
#          KVP_WORKERS=2 (fairness_equal_w2) they are spread 3 + 3 over the
#          workers and each worker's three take turns
#   light  one heavy client with a deep backlog of 4 MiB transfers beside
#          a light one sending 64 KiB transfers one at a time (the heavy one
#          keeps 40 queued for 600 transfers, longer than admission_ms): the light
#          client sees no "no-buffers" (its turn comes with the next slot
#          and buffer that free), whatever the heavy one's own backlog costs it
#
# Both check the per-client counts in stats (admitted, waited, refused)
# against what the clients saw. Correctness only: no rates are asserted.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

MODE=${1:-equal}
[[ -n ${KVP_FAIR_BENCH:-} && -n ${KVP_LATENCY_BENCH:-} ]] ||
	setup_fail "\$KVP_FAIR_BENCH and \$KVP_LATENCY_BENCH must be set (meson does)"
require_netns
require_bins
init_test
KVP_TEST=test_fairness_$MODE
KVP_TIMEOUTS_EXTRA="admission_ms = 300;"
CONF='limits = { max_inflight = 16; };
stage = { host = true; pool = 8388608; buffer = 1048576; };'
start_pair 57 "$CONF"

spawn "$NS_D" "$KVP_TMP/sink.out" - "$KVP_LATENCY_BENCH" sink -s "$(sock_of decode0)" \
	--size 4m --key-file "$KVP_TMP/key" --stop-file "$KVP_TMP/stop"
SINK=$SPAWNED
wait_file "$KVP_TMP/key" 30 "$SINK"

case $MODE in
equal)
	ARGS=(--clients 6 --seg 1m --count 64 --queue 16)
	;;
light)
	ARGS=(--clients 1 --seg 4m --count 600 --queue 40 --light-count 50 --light-seg 64k
		--light-gap-ms 2)
	;;
*) setup_fail "unknown mode $MODE (equal, light)" ;;
esac
spawn "$NS_P" "$KVP_TMP/fair.json" "$KVP_TMP/fair.err" "$KVP_FAIR_BENCH" -s "$(sock_of prefill0)" \
	--peer decode0 --key-file "$KVP_TMP/key" --linger-file "$KVP_TMP/linger" --run-timeout 120 \
	"${ARGS[@]}"
FAIR=$SPAWNED
wait_file "$KVP_TMP/fair.json" 150 "$FAIR"
log "clients: $(cat "$KVP_TMP/fair.json")"
stats_json prefill0 >"$KVP_TMP/stats.json"
touch "$KVP_TMP/linger"
wait_pid "$FAIR" 30 || fail "kvp-fair-bench failed: $(cat "$KVP_TMP/fair.err")"

R=$KVP_TMP/fair.json
S=$KVP_TMP/stats.json
# The daemon's rows, in connection order, are the bench's clients in the order it opened them.
json_check "$S" "len(d['clients']) == $([[ $MODE == equal ]] && echo 6 || echo 2)" \
	"stats must list every connected client"
python3 - "$R" "$S" <<'PY' || fail "the daemon's per-client counts disagree with what the clients saw"
import json, sys
r, s = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
seen = r["clients"] + ([r["light"]] if "light" in r else [])
rows = sorted(s["clients"], key=lambda c: c["id"] & 0xffff)
for c, row in zip(seen, rows):
    nb = c["status"].get("no-buffers", 0)
    assert row["refused"] == nb, (row, c)
    assert row["admitted"] >= c["status"]["ok"], (row, c)
    assert row["inflight"] == 0 and row["sq_depth"] == 0, row
PY

if [[ $MODE == equal ]]; then
	json_check "$R" "all(c['status']['ok'] == 64 for c in d['clients'])" \
		"every transfer of the six clients must complete ok"
	json_check "$R" "d['min_share'] >= 0.5" \
		"each client must complete at least half of its share while all have work waiting"
	json_check "$S" "all(c['waited'] > 0 for c in d['clients'])" \
		"under overload every client's transfers must have waited (and been counted)"
	log "shares while all six had work: $(json_get "$R" "[c['share'] for c in d['clients']]")"
	# With several workers (fairness_equal_w2) each worker takes turns among its own
	# clients: the six must be spread over the workers, as the stats rows say.
	if ((${KVP_WORKERS:-1} > 1)); then
		json_check "$S" "sorted(c['worker'] for c in d['clients']) == sorted(i % $KVP_WORKERS for i in range(6))" \
			"the six clients must be spread over the $KVP_WORKERS workers (stats clients[].worker)"
		log "clients' workers: $(json_get "$S" "[c['worker'] for c in d['clients']]")"
	fi
else
	json_check "$R" "d['light']['completed'] == 50 and d['light']['status']['ok'] == 50" \
		"the light client's transfers must all complete ok (no no-buffers)"
	json_check "$R" "sum(d['clients'][0]['status'].values()) == 600 and set(k for k, v in d['clients'][0]['status'].items() if v) <= {'ok', 'no-buffers'}" \
		"the heavy client's transfers end ok or no-buffers"
	log "light client: $(json_get "$R" "d['light']"); heavy: $(json_get "$R" "d['clients'][0]['status']")"
fi
touch "$KVP_TMP/stop"
wait_pid "$SINK" 30 || fail "sink client failed"
for n in prefill0 decode0; do
	wait_json "$n" stats "d['staging']['in_use'] == 0 and d['totals']['inflight'] == 0" 30 \
		"$n: staging pool whole again, nothing in flight"
done
stop_daemon_checked prefill0
stop_daemon_checked decode0
