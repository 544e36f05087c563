#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark, not a test: a head-sliced KV transfer (prefill TP4 -> decode TP8
# of a 64-layer GQA model, 8 KV heads x 128, bf16, 64-token pages, 32k
# tokens: one decode rank's 1 GiB share of one prefill rank) through strided
# segments, against an unsliced transfer of the same bytes in the same run
# (tools/bench/head_slice.py), pages contiguous and scattered; then the same
# through kvproxy.sglang (tools/bench/sglang_head_slice.py: one prefill rank
# serving its two decode ranks, 2 GiB, against the same bytes to one decode
# rank of equal TP), on the same daemons (with --gpu: GPU memory, staged).
# --no-adapter skips that part.
#
#   tools/bench/head_slice.sh [BUILD_DIR] [--gpu] [--reps N] [--no-adapter] [ARGS for head_slice.py]
#
# Here: two kvproxyd in two network namespaces joined by a veth pair (as
# tcp_vs_iperf.sh), the decode daemon's worker on the other CPU. With --gpu
# (the GPU machine, no iproute2): both daemons on loopback, KV in GPU memory
# (staged through the pinned pool), each daemon's lcores on CPUs of its own.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$ROOT/build
GPU=0
REPS=3
ADAPTER=1
ARGS=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--gpu) GPU=1; ARGS+=(--gpu); shift ;;
	--reps) REPS=$2; shift 2 ;;
	--no-adapter) ADAPTER=0; shift ;;
	-h | --help) sed -n 3,18p "$0"; exit 0 ;;
	--*) ARGS+=("$1"); shift ;;
	*) BUILD=$(cd "$1" && pwd); shift ;;
	esac
done
export KVPROXYD=$BUILD/app/kvproxyd KVPROXYCTL=$BUILD/tools/kvproxyctl/kvproxyctl
export KVPROXY_BENCH=$BUILD/tools/bench/kvproxy-bench
export KVPROXY_LIB=${KVPROXY_LIB:-$BUILD/lib/client/libkvproxy.so}
# shellcheck source=../../tests/integ/lib.sh
source "$ROOT/tests/integ/lib.sh"
KVP_TEST=bench_head_slice
require_bins
init_test
CONF='limits = { max_blocks = 65536; }; stage = { pool = 134217728; };'
if [[ $GPU == 1 ]]; then
	# Each daemon's main and worker lcores on CPUs of their own (prefill 0,1; decode 2,3).
	export KVP_EAL_NO_LCORES=1 KVP_EAL_PREFILL="-l 0,1" KVP_EAL_DECODE="-l 2,3"
	loopback_pair "$CONF"
else
	require_netns
	export KVP_EAL_DECODE=${KVP_EAL_DECODE---main-lcore 1}
	start_pair 93 "$CONF"
fi
log "EAL: ${KVP_EAL[*]}; prefill0 ${KVP_EAL_PREFILL:-}; decode0 ${KVP_EAL_DECODE:-}"
for scatter in "" --scatter; do
	python3 "$ROOT/tools/bench/head_slice.py" --prefill-sock "$(sock_of prefill0)" \
		--decode-sock "$(sock_of decode0)" --reps "$REPS" ${scatter:+"$scatter"} "${ARGS[@]}" \
		--json "$KVP_TMP/head_slice${scatter:+_scatter}.json"
done
if [[ $ADAPTER == 1 ]]; then
	for scatter in "" --scatter; do
		python3 "$ROOT/tools/bench/sglang_head_slice.py" --prefill-sock "$(sock_of prefill0)" \
			--decode-sock "$(sock_of decode0)" --reps "$REPS" ${scatter:+"$scatter"} "${ARGS[@]}" \
			--json "$KVP_TMP/sglang_head_slice${scatter:+_scatter}.json"
	done
fi
