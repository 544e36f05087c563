#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark, not a test: does kvproxy scale with worker lcores? For each W
# (1, 2, 4, 6 worker lcores per daemon) two kvproxyd on loopback move
# --size bytes per figure (1 GiB), split over W client pairs that start
# together (one pair per worker: clients go to the worker with the fewest),
# host memory to host memory and GPU memory to GPU memory (through the
# staging pool), in 4 MiB blocks and 64 KiB KV pages; in the same run,
# interleaved, iperf3 with W processes x 1 stream over loopback (a hot
# buffer resent), and W plain TCP streams of the same distinct bytes as
# kvproxy's W client pairs (kvp-tcp-stream, pinned as iperf3 is). Reports
# GB/s (best and median of --reps), the ratios to iperf3 and to the plain
# streams at that W, GPU over host, and the CPU seconds both daemons (or
# all iperf3 / stream processes) spent per GB; writes the figures as JSON
# and a PNG chart (matplotlib).
#
#   tools/bench/scale_workers.sh [BUILD_DIR] [--workers 1,2,4,6] [--size BYTES] [--reps N]
#       [--json FILE] [--png FILE] [--no-gpu] [--no-host] [--no-iperf] [--no-stream]
#       [--conf 'EXTRA CONFIG']
#
# CPUs: each daemon's main and worker lcores get CPUs of their own, in
# order from this process's affinity (prefill0 first, then decode0); the
# clients the CPUs left over; iperf3's clients the prefill workers' CPUs and
# its servers the decode workers' (one each). With fewer CPUs than 2W + 2
# the lcores share CPUs and the script says so. GPU figures are skipped
# (said why) without a usable GPU (tests/gpu/gpu_client probe), the iperf3
# reference without iperf3, the chart without matplotlib (PYTHON=/usr/bin/python3
# picks another interpreter). On a bundle (tools/bundle.sh) set
# LD_LIBRARY_PATH and KVP_EAL_EXTRA="-d .../librte_mempool_ring.so.23".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$ROOT/build
WORKERS=(1 2 4 6)
SIZE=$((1024 * 1024 * 1024))
REPS=3
JSON_OUT=""
PNG_OUT=""
GPU=1
HOST=1
IPERF=1
STREAM=1
EXTRA_CONF=""
while [[ $# -gt 0 ]]; do
	case $1 in
	--workers) IFS=, read -r -a WORKERS <<<"$2"; shift 2 ;;
	--size) SIZE=$2; shift 2 ;;
	--reps) REPS=$2; shift 2 ;;
	--json) JSON_OUT=$2; shift 2 ;;
	--png) PNG_OUT=$2; shift 2 ;;
	--no-gpu) GPU=0; shift ;;
	--no-host) HOST=0; shift ;;
	--no-iperf) IPERF=0; shift ;;
	--no-stream) STREAM=0; shift ;;
	--conf) EXTRA_CONF=$2; shift 2 ;;
	-h | --help) sed -n 3,29p "$0"; exit 0 ;;
	*) BUILD=$(cd "$1" && pwd); shift ;;
	esac
done
export KVPROXYD=$BUILD/app/kvproxyd KVPROXYCTL=$BUILD/tools/kvproxyctl/kvproxyctl
export KVPROXY_BENCH=$BUILD/tools/bench/kvproxy-bench
GPU_CLIENT=$BUILD/tests/gpu/gpu_client
PY=${PYTHON:-python3}
HELPER=$ROOT/tools/bench/scale_workers.py
# shellcheck source=../../tests/integ/lib.sh
source "$ROOT/tests/integ/lib.sh"
KVP_TEST=bench_scale_workers
require_bins
init_test
RESULTS=$KVP_TMP/results.jsonl
: >"$RESULTS"
note() {
	log "$*"
	"$PY" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$*" >>"$RESULTS"
}

if [[ $GPU == 1 ]]; then
	if [[ ! -x $GPU_CLIENT ]]; then
		note "GPU figures skipped: $GPU_CLIENT was not built (no cuda.h at build time)"
		GPU=0
	elif ! "$GPU_CLIENT" probe >"$KVP_TMP/probe.out" 2>&1; then
		note "GPU figures skipped: $(tail -1 "$KVP_TMP/probe.out")"
		GPU=0
	fi
fi
if [[ $IPERF == 1 ]] && ! command -v iperf3 >/dev/null; then
	note "iperf3 reference skipped: iperf3 is not installed (apt-get install iperf3); no ratios"
	IPERF=0
fi
TCP_STREAM=$BUILD/tools/bench/kvp-tcp-stream
if [[ $STREAM == 1 && ! -x $TCP_STREAM ]]; then
	note "plain-stream reference skipped: $TCP_STREAM was not built"
	STREAM=0
fi
command -v taskset >/dev/null || note "taskset missing: clients and iperf3 run unpinned"
[[ $HOST == 1 || $GPU == 1 ]] || setup_fail "nothing to measure (--no-host and no GPU)"

mapfile -t CPUS < <("$PY" -c 'import os; print("\n".join(map(str, sorted(os.sched_getaffinity(0)))))')
NCPU=${#CPUS[@]}
cpu() { echo "${CPUS[$(($1 % NCPU))]}"; }
join() {
	local IFS=,
	echo "$*"
}

# CPU plan for W workers: with 2W + 2 CPUs, prefill0 takes the first W + 1
# (main, then its workers) and decode0 the next; with fewer, the workers
# take them first (prefill's, then decode's) and the mains wrap around, so
# that the workers of the two daemons share as little as can be.
plan_cpus() {
	local w=$1 i
	PM=() PW=() DM=() DW=()
	if ((2 * w + 2 <= NCPU)); then
		PM=$(cpu 0) DM=$(cpu $((w + 1)))
		for ((i = 1; i <= w; i++)); do PW+=("$(cpu "$i")"); DW+=("$(cpu $((w + 1 + i)))"); done
	else
		for ((i = 0; i < w; i++)); do PW+=("$(cpu "$i")"); DW+=("$(cpu $((w + i)))"); done
		PM=$(cpu $((2 * w))) DM=$(cpu $((2 * w + 1)))
	fi
}

# lcores MAIN WORKER...: "--lcores 0@MAIN,1@W1,...".
lcores() {
	local map="0@$1" i=1
	shift
	for c in "$@"; do map+=",$i@$c"; i=$((i + 1)); done
	echo "--lcores $map"
}

STAGE_POOL=134217728
CONF="limits = { max_clients = 32; }; stage = { pool = $STAGE_POOL; buffer = 4194304; }; $EXTRA_CONF"
for W in "${WORKERS[@]}"; do
	need=$((2 * W + 2))
	plan_cpus "$W"
	pw=("${PW[@]}") dw=("${DW[@]}") rest=()
	for ((i = need; i < NCPU; i++)); do rest+=("${CPUS[i]}"); done
	# Every worker's staging pool comes out of the EAL's memory (-m).
	KVP_EAL=(--no-huge --no-shconf -m $((256 + W * (STAGE_POOL >> 20))) --log-level=lib.eal:error
		"${KVP_EAL_EXTRA_ARR[@]}")
	KVP_EAL_PREFILL=$(lcores "$PM" "${pw[@]}")
	KVP_EAL_DECODE=$(lcores "$DM" "${dw[@]}")
	export KVP_EAL_PREFILL KVP_EAL_DECODE
	CLIENT_CPUS=$(join "${rest[@]}")
	where="W=$W: prefill0 main CPU $PM, workers on CPUs $(join "${pw[@]}"); decode0 main CPU $DM, workers on CPUs $(join "${dw[@]}"); clients on ${CLIENT_CPUS:-any CPU}"
	((need <= NCPU)) || where+=" (only $NCPU CPUs: lcores share CPUs)"
	note "$where"
	loopback_pair "$CONF"
	wait_json prefill0 stats "len(d['workers']) == $W" 10 "prefill0 runs $W workers"
	common=(--workers "$W" --size "$SIZE" --prefill-sock "$(sock_of prefill0)"
		--decode-sock "$(sock_of decode0)" --prefill-admin "$(admin_of prefill0)"
		--decode-admin "$(admin_of decode0)" --prefill-pid "${DPID[prefill0]}"
		--decode-pid "${DPID[decode0]}" --tmp "$KVP_TMP" --bench "$KVPROXY_BENCH"
		--gpu-client "$GPU_CLIENT" ${CLIENT_CPUS:+--client-cpus "$CLIENT_CPUS"})
	for ((r = 0; r < REPS; r++)); do
		# Interleaved, so drift on a shared machine hits every series alike.
		if [[ $IPERF == 1 ]]; then
			"$PY" "$HELPER" iperf --workers "$W" --rep "$r" --client-cpus "$(join "${pw[@]}")" \
				--server-cpus "$(join "${dw[@]}")" | tee -a "$RESULTS" >&2 ||
				fail "iperf3 with $W processes failed"
		fi
		if [[ $STREAM == 1 ]]; then
			"$PY" "$HELPER" stream --workers "$W" --size "$SIZE" --stream "$TCP_STREAM" --rep "$r" \
				--client-cpus "$(join "${pw[@]}")" --server-cpus "$(join "${dw[@]}")" |
				tee -a "$RESULTS" >&2 || fail "$W plain TCP streams failed"
		fi
		for mode in host gpu; do
			[[ $mode == host && $HOST == 1 || $mode == gpu && $GPU == 1 ]] || continue
			for seg in 4194304 65536; do
				per=$((seg >= 1048576 ? 64 : 1024))
				"$PY" "$HELPER" run --mode "$mode" --seg "$seg" --per-xfer "$per" --rep "$r" \
					"${common[@]}" | tee -a "$RESULTS" >&2 ||
					fail "kvproxy $mode, $seg-byte segments, W=$W failed"
			done
		done
	done
	stop_daemon_checked prefill0
	stop_daemon_checked decode0
done
"$PY" "$HELPER" report --results "$RESULTS" --size "$SIZE" --reps "$REPS" --cpus "$(join "${CPUS[@]}")" \
	${JSON_OUT:+--json "$JSON_OUT"} ${PNG_OUT:+--png "$PNG_OUT"}
