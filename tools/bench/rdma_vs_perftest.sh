#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark, not a test: kvproxy over its RDMA transport against perftest's
# ib_write_bw between the same two Soft-RoCE devices (rxe0 -> rxe1 across
# the veth pair), in one VM run (tools/rdma-vm.sh), reported as ratios.
# Soft-RoCE under emulation is slow: only the ratios mean anything.
#
#   tools/bench/rdma_vs_perftest.sh [BUILD_DIR] [--size BYTES] [--reps N] [--json FILE]
#
# For 64 KiB, 1 MiB and 4 MiB messages ib_write_bw writes --size bytes
# (default 64 MiB); kvproxy-bench moves --size bytes in segments of the same
# size, 16 per transfer, 8 transfers in flight; then the KV-like pattern
# (64 KiB pages contiguous on both sides, 256 per transfer). Best of --reps.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$ROOT/build
SIZE=$((64 << 20))
REPS=2
JSON_OUT=""
INSIDE=0
while [[ $# -gt 0 ]]; do
	case $1 in
	--size) SIZE=$2; shift 2 ;;
	--reps) REPS=$2; shift 2 ;;
	--json) JSON_OUT=$2; shift 2 ;;
	--inside) INSIDE=1; shift ;;
	-h | --help) sed -n 3,13p "$0"; exit 0 ;;
	*) BUILD=$(cd "$1" && pwd); shift ;;
	esac
done

if [[ $INSIDE -eq 0 ]]; then
	command -v ib_write_bw >/dev/null || apt-get install -y -qq perftest >/dev/null ||
		{ echo "perftest (ib_write_bw) is needed: apt-get install perftest" >&2; exit 1; }
	# The VM shares the build directory (the current one) read-write, not /tmp.
	cd "$BUILD"
	rc=0
	bash "$ROOT/tools/rdma-vm.sh" --timeout 3000 -- bash "$ROOT/tools/bench/rdma_vs_perftest.sh" \
		"$BUILD" --size "$SIZE" --reps "$REPS" --json "$BUILD/rdma_vs_perftest.json" --inside || rc=$?
	[[ $rc -ne 0 || -z $JSON_OUT ]] || cp "$BUILD/rdma_vs_perftest.json" "$JSON_OUT"
	exit "$rc"
fi

export KVPROXYD=$BUILD/app/kvproxyd KVPROXYCTL=$BUILD/tools/kvproxyctl/kvproxyctl
export KVPROXY_BENCH=$BUILD/tools/bench/kvproxy-bench
# shellcheck source=../../tests/integ/lib.sh
source "$ROOT/tests/integ/lib.sh"
KVP_TEST=bench_rdma
require_bins
init_test
GID=${KVP_RDMA_GID_INDEX:-1}
MSGS=(65536 1048576 4194304)

# perftest SIZE: best Gbit/s of ib_write_bw rxe0 -> rxe1 moving $SIZE bytes.
perftest() {
	local msg=$1 n=$((SIZE / $1)) r g best=0 port
	for ((r = 0; r < REPS; r++)); do
		port=$((18515 + r))
		spawn "" "$KVP_TMP/pt-server.log" - ib_write_bw -d "$KVP_RDMA_DEV1" -x "$GID" -s "$msg" \
			-n "$n" -p "$port" -F --report_gbits
		local srv=$SPAWNED dl
		dl=$(deadline_in 30)
		until ib_write_bw -d "$KVP_RDMA_DEV0" -x "$GID" -s "$msg" -n "$n" -p "$port" -F \
			--report_gbits "$KVP_RDMA_IP1" >"$KVP_TMP/pt-client.log" 2>&1; do
			before "$dl" || setup_fail "ib_write_bw client failed: $(tail -3 "$KVP_TMP/pt-client.log")"
			sleep 0.2
		done
		wait_pid "$srv" 60 || true
		# the result row: "#bytes #iterations BW-peak BW-average MsgRate"
		g=$(awk -v m="$msg" '$1 == m && NF >= 4 { print $4 }' "$KVP_TMP/pt-client.log" | tail -1)
		[[ -n $g ]] || setup_fail "no ib_write_bw result: $(tail -5 "$KVP_TMP/pt-client.log")"
		log "ib_write_bw $msg run $r: $g Gbit/s"
		best=$(awk -v a="$best" -v b="$g" 'BEGIN { print (b > a) ? b : a }')
	done
	echo "$best"
}

KVP_TRANSPORT=rdma
KVP_PEER_MS=3000
export KVP_TRANSPORT KVP_PEER_MS
write_conf prefill0 "$KVP_RDMA_IP0:7400" decode0 "$KVP_RDMA_IP1:7400" \
	"rdma = { devices = \"$KVP_RDMA_DEV0\"; };"
write_conf decode0 "$KVP_RDMA_IP1:7400" prefill0 "$KVP_RDMA_IP0:7400" \
	"rdma = { devices = \"$KVP_RDMA_DEV1\"; };"

# kvp SEG EXTRA...: best Gbit/s of kvproxy-bench moving $SIZE bytes.
kvp() {
	local seg=$1 r g best=0 key dpid
	shift
	for ((r = 0; r < REPS; r++)); do
		key="$KVP_TMP/key.$seg.$r"
		spawn "" "$KVP_TMP/decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
			--size "$SIZE" --seed "$r" --key-file "$key" --min-seg "$seg" --max-seg "$seg" \
			--timeout 600 "$@"
		dpid=$SPAWNED
		"$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 --key-file "$key" \
			--size "$SIZE" --seed "$r" --min-seg "$seg" --max-seg "$seg" --inflight 8 \
			--wait-key 60 --json "$@" >"$KVP_TMP/prefill.json" ||
			fail "kvproxy run failed (segment $seg $*)"
		wait_pid "$dpid" 300 || fail "decode client did not verify the data (segment $seg)"
		g=$(json_get "$KVP_TMP/prefill.json" 'd["gbps"]')
		log "kvproxy $seg $* run $r: $g Gbit/s"
		best=$(awk -v a="$best" -v b="$g" 'BEGIN { print (b > a) ? b : a }')
	done
	echo "$best"
}

rows=()
for m in "${MSGS[@]}"; do
	rows+=("$m $(perftest "$m")")
done
# The VM has 2 vCPUs and both daemons get EAL lcores 0,1: the decode
# daemon's main lcore goes to vCPU 1 so its worker runs on 0, the prefill
# worker on 1 (not both workers on vCPU 1).
export KVP_EAL_DECODE=${KVP_EAL_DECODE---main-lcore 1}
start_daemon prefill0 ""
start_daemon decode0 ""
wait_admin prefill0
wait_admin decode0
log "worker lcores: prefill0 $(worker_lcores prefill0), decode0 $(worker_lcores decode0)"
wait_peer_up prefill0 decode0
wait_json prefill0 stats "sum(r['qps_up'] for r in d['rdma']['rails']) == 1" 60 "send QP up"
out=()
for row in "${rows[@]}"; do
	read -r m pt <<<"$row"
	k=$(kvp "$m" --segs-per-xfer 16)
	out+=("$m $pt $k")
done
# KV-like: 64 KiB pages contiguous on both sides (coalesced into rdma.chunk WRITEs).
kv=$(kvp 65536 --segs-per-xfer 256 --linear)
pt4=$(awk '$1 == 4194304 { print $2 }' <<<"$(printf '%s\n' "${rows[@]}")")
out+=("kv-64k-pages $pt4 $kv")
stats_json prefill0 >"$KVP_TMP/p.json"
json_check "$KVP_TMP/p.json" "d['rdma']['tcp_fallbacks'] == 0 and d['rdma']['xfers'] == d['completions']['ok']" \
	"some transfers did not go by RDMA"

printf '\n%-14s %14s %14s %10s\n' "message" "perftest Gb/s" "kvproxy Gb/s" "ratio"
json="{\"size\": $SIZE, \"runs\": ["
sep=""
for row in "${out[@]}"; do
	read -r m pt k <<<"$row"
	ratio=$(awk -v a="$k" -v b="$pt" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
	printf '%-14s %14s %14s %10s\n' "$m" "$pt" "$k" "$ratio"
	json+="$sep{\"message\": \"$m\", \"perftest_gbps\": $pt, \"kvproxy_gbps\": $k, \"ratio\": $ratio}"
	sep=", "
done
json+="]}"
[[ -z $JSON_OUT ]] || echo "$json" >"$JSON_OUT"
stop_daemon_checked prefill0
stop_daemon_checked decode0
