#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark, not a test: kvproxy over TCP between two network namespaces
# against iperf3 over the same veth, in one run, reported as ratios.
#
#   tools/bench/tcp_vs_iperf.sh [BUILD_DIR] [--size BYTES] [--reps N] [--json FILE]
#                               [--conf 'EXTRA CONFIG', e.g. 'tcp = { zerocopy = true; };']
#
# For each segment size kvproxy-bench moves --size bytes --reps times;
# iperf3 runs 5 s --reps times single-stream and again with as many streams
# as kvproxy has connections to its peer (tcp.connections). Best runs kept;
# each kvproxy figure is printed as a ratio of both.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$ROOT/build
SIZE=$((1024 * 1024 * 1024))
REPS=3
JSON_OUT=""
EXTRA_CONF=""
SEGS=(65536 1048576 4194304)
while [[ $# -gt 0 ]]; do
	case $1 in
	--size) SIZE=$2; shift 2 ;;
	--reps) REPS=$2; shift 2 ;;
	--json) JSON_OUT=$2; shift 2 ;;
	--segs) IFS=, read -r -a SEGS <<<"$2"; shift 2 ;;
	--conf) EXTRA_CONF=$2; shift 2 ;;
	-h | --help) sed -n 3,12p "$0"; exit 0 ;;
	*) BUILD=$(cd "$1" && pwd); shift ;;
	esac
done
export KVPROXYD=$BUILD/app/kvproxyd KVPROXYCTL=$BUILD/tools/kvproxyctl/kvproxyctl
export KVPROXY_BENCH=$BUILD/tools/bench/kvproxy-bench

# shellcheck source=../../tests/integ/lib.sh
source "$ROOT/tests/integ/lib.sh"
KVP_TEST=bench_tcp
require_netns
require_bins
command -v iperf3 >/dev/null || setup_fail "iperf3 is not installed (apt-get install iperf3)"
init_test
start_pair 91 "$EXTRA_CONF"

links=$(ctl prefill0 --json peers | python3 -c 'import json,sys; print(json.load(sys.stdin)["peers"][0]["links_up"])')
log "kvproxy: $links TCP connection(s) to the peer (tcp.connections)"

spawn "$NS_D" "$KVP_TMP/iperf3-server.log" - iperf3 -s -B "$ADDR_D" -p 5201
ipsrv=$SPAWNED
# run_iperf STREAMS: sets best to the best Gbit/s of $REPS 5 s runs.
run_iperf() {
	local r g dl
	best=0
	for ((r = 0; r < REPS; r++)); do
		dl=$(deadline_in 20)
		# The server may not listen yet: retry until a run reports a result.
		until in_ns "$NS_P" iperf3 -c "$ADDR_D" -p 5201 -t 5 -P "$1" -J >"$KVP_TMP/iperf3.json" 2>/dev/null &&
			grep -q '"sum_received"' "$KVP_TMP/iperf3.json"; do
			before "$dl" || setup_fail "iperf3 client could not reach the server"
			sleep "$KVP_POLL"
		done
		g=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.3f" % (d["end"]["sum_received"]["bits_per_second"]/1e9))' "$KVP_TMP/iperf3.json")
		log "iperf3 -P $1 run $r: $g Gbit/s"
		best=$(awk -v a="$best" -v b="$g" 'BEGIN { print (b > a) ? b : a }')
	done
}
run_iperf 1
iperf_gbps=$best
iperf_multi=$iperf_gbps
if ((links > 1)); then
	run_iperf "$links"
	iperf_multi=$best
fi
stop_pid "$ipsrv" 5 || true
untrack "$ipsrv"
log "iperf3: $iperf_gbps Gbit/s single stream, $iperf_multi Gbit/s with $links streams"

# run_kvp SEG EXTRA...: sets best to the best Gbit/s of $REPS runs of SEG-byte segments.
run_kvp() {
	local seg=$1 r g key dpid
	shift
	best=0
	for ((r = 0; r < REPS; r++)); do
		key="$KVP_TMP/key.$seg.$r"
		spawn "$NS_D" "$KVP_TMP/decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
			--size "$SIZE" --seed "$r" --key-file "$key" --min-seg "$seg" --max-seg "$seg" \
			--timeout 300 "$@"
		dpid=$SPAWNED
		in_ns "$NS_P" "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
			--key-file "$key" --size "$SIZE" --seed "$r" --min-seg "$seg" --max-seg "$seg" \
			--inflight 8 --json "$@" >"$KVP_TMP/prefill.json" ||
			fail "prefill run failed (segment $seg $*)"
		wait_pid "$dpid" 300 || fail "decode client did not verify the data (segment $seg)"
		g=$(json_get "$KVP_TMP/prefill.json" 'd["gbps"]')
		stats_json prefill0 >"$KVP_TMP/stats.json"
		log "segment $seg $* run $r: $g Gbit/s (bytes per link so far: $(json_get "$KVP_TMP/stats.json" 'd["peers"][0]["link_tx_bytes"]'))"
		best=$(awk -v a="$best" -v b="$g" 'BEGIN { print (b > a) ? b : a }')
	done
}

ratio_of() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

results=()
for seg in "${SEGS[@]}"; do
	run_kvp "$seg" --segs-per-xfer 16
	results+=("$seg $best $(ratio_of "$best" "$iperf_gbps") $(ratio_of "$best" "$iperf_multi")")
done

# KV-like: one request's 64 KiB pages, contiguous on both sides, 256 per transfer.
run_kvp 65536 --segs-per-xfer 256 --linear
results+=("kv-64k-pages $best $(ratio_of "$best" "$iperf_gbps") $(ratio_of "$best" "$iperf_multi")")

printf '\n%-12s %12s %10s %12s\n' "segment" "Gbit/s" "x iperf3" "x iperf3 -P$links"
printf '%-12s %12s %10s %12s\n' "iperf3" "$iperf_gbps" "1.00" "-"
printf '%-12s %12s %10s %12s\n' "iperf3 -P$links" "$iperf_multi" "-" "1.00"
for row in "${results[@]}"; do
	read -r seg g ratio ratio_m <<<"$row"
	printf '%-12s %12s %10s %12s\n' "$seg" "$g" "$ratio" "$ratio_m"
done
if [[ -n $JSON_OUT ]]; then
	{
		printf '{"iperf3_gbps": %s, "iperf3_multi_gbps": %s, "streams": %s, "size": %s, "runs": [' \
			"$iperf_gbps" "$iperf_multi" "$links" "$SIZE"
		sep=""
		for row in "${results[@]}"; do
			read -r seg g ratio ratio_m <<<"$row"
			printf '%s{"segment": "%s", "gbps": %s, "ratio": %s, "ratio_multi": %s}' \
				"$sep" "$seg" "$g" "$ratio" "$ratio_m"
			sep=", "
		done
		printf ']}\n'
	} >"$JSON_OUT"
fi
