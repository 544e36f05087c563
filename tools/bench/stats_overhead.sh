#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark, not a test: what the per-transfer timing and stats path costs.
# One pair of kvproxyd in two network namespaces; kvproxy-bench runs with
# stats.enabled on and off on both nodes, interleaved, in the same run; the
# median Gbit/s of each is reported with the ratio on/off (1.00 = free).
#
#   tools/bench/stats_overhead.sh [BUILD_DIR] [--size BYTES] [--reps N]
#                                 [--segs SEG,...] [--json FILE]
#
# stats.enabled switches the phase histograms and the slowest table; the
# per-transfer timestamps that completions carry are always taken.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$ROOT/build
SIZE=$((512 * 1024 * 1024))
REPS=5
JSON_OUT=""
SEGS=(16384 65536 1048576)
while [[ $# -gt 0 ]]; do
	case $1 in
	--size) SIZE=$2; shift 2 ;;
	--reps) REPS=$2; shift 2 ;;
	--json) JSON_OUT=$2; shift 2 ;;
	--segs) IFS=, read -r -a SEGS <<<"$2"; shift 2 ;;
	-h | --help) sed -n 3,12p "$0"; exit 0 ;;
	*) BUILD=$(cd "$1" && pwd); shift ;;
	esac
done
export KVPROXYD=$BUILD/app/kvproxyd KVPROXYCTL=$BUILD/tools/kvproxyctl/kvproxyctl
export KVPROXY_BENCH=$BUILD/tools/bench/kvproxy-bench

# shellcheck source=../../tests/integ/lib.sh
source "$ROOT/tests/integ/lib.sh"
KVP_TEST=bench_stats
require_netns
require_bins
init_test
# Both daemons get EAL lcores 0,1: the decode daemon's main lcore goes to
# CPU 1 so its worker runs on 0, the prefill worker on 1 (as tcp_vs_iperf.sh).
export KVP_EAL_DECODE=${KVP_EAL_DECODE---main-lcore 1}
start_pair 92
log "worker lcores: prefill0 $(worker_lcores prefill0), decode0 $(worker_lcores decode0)"

# stats_set on|off: stats.enabled on both nodes.
stats_set() {
	local v=false n
	[[ $1 == on ]] && v=true
	for n in prefill0 decode0; do
		ctl "$n" config_set stats.enabled "$v" >/dev/null || fail "config_set stats.enabled $v on $n"
	done
}

# run_one SEG MODE REP: prints Gbit/s of one verified run.
run_one() {
	local seg=$1 mode=$2 r=$3 key="$KVP_TMP/key.$1.$2.$3" dpid
	stats_set "$mode"
	spawn "$NS_D" "$KVP_TMP/decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
		--size "$SIZE" --seed "$r" --key-file "$key" --min-seg "$seg" --max-seg "$seg" \
		--segs-per-xfer 16 --timeout 300
	dpid=$SPAWNED
	in_ns "$NS_P" "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
		--key-file "$key" --size "$SIZE" --seed "$r" --min-seg "$seg" --max-seg "$seg" \
		--segs-per-xfer 16 --inflight 8 --json >"$KVP_TMP/prefill.json" ||
		fail "prefill run failed (segment $seg, stats $mode)"
	wait_pid "$dpid" 300 || fail "decode client did not verify the data (segment $seg)"
	json_get "$KVP_TMP/prefill.json" 'd["gbps"]'
}

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

results=()
for seg in "${SEGS[@]}"; do
	on=() off=()
	for ((r = 0; r < REPS; r++)); do
		# Alternate the order so drift (page cache, CPU clocks) hits both alike.
		for mode in $( ((r % 2)) && echo "off on" || echo "on off"); do
			g=$(run_one "$seg" "$mode" "$r")
			log "segment $seg stats $mode run $r: $g Gbit/s"
			if [[ $mode == on ]]; then on+=("$g"); else off+=("$g"); fi
		done
	done
	mon=$(median "${on[@]}")
	moff=$(median "${off[@]}")
	ratio=$(awk -v a="$mon" -v b="$moff" 'BEGIN { printf "%.3f", a / b }')
	results+=("$seg $mon $moff $ratio")
done
stats_set on
xfers=$(ctl prefill0 --json stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["totals"]["xfers_done"])')

printf '\n%-10s %14s %14s %12s\n' "segment" "stats on" "stats off" "on/off"
for row in "${results[@]}"; do
	read -r seg a b ratio <<<"$row"
	printf '%-10s %10s Gb/s %9s Gb/s %12s\n' "$seg" "$a" "$b" "$ratio"
done
printf '(%s transfers of 16 segments; median of %s runs each)\n' "$xfers" "$REPS"
if [[ -n $JSON_OUT ]]; then
	{
		printf '{"size": %s, "reps": %s, "runs": [' "$SIZE" "$REPS"
		sep=""
		for row in "${results[@]}"; do
			read -r seg a b ratio <<<"$row"
			printf '%s{"segment": %s, "gbps_on": %s, "gbps_off": %s, "ratio": %s}' "$sep" "$seg" "$a" "$b" "$ratio"
			sep=", "
		done
		printf ']}\n'
	} >"$JSON_OUT"
fi
