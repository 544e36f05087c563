#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark, not a test (needs a CUDA GPU): in one run, raw pinned
# cuMemcpyDtoHAsync rates (the reference), kvproxy's staging copies alone
# (kvp-stage-copy-bench: the wire taken out), then two kvproxyd on loopback
# moving 1 GiB of KV from GPU memory to GPU memory through the staging
# pool, beside the same transfer from host memory (zero-copy), for 4 MiB
# blocks and 64 KiB pages, with two staging buffer sizes.
#
#   tools/bench/gpu_staging.sh [BUILD_DIR]
# On a host without DPDK's plugin directory (e.g. a bundle from
# tools/bundle.sh) set KVP_EAL_EXTRA="-d /path/librte_mempool_ring.so.23".
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=$(cd "${1:-$ROOT/build}" && pwd)
export GPU_CLIENT=$B/tests/gpu/gpu_client KVPROXYD=$B/app/kvproxyd
export KVPROXYCTL=$B/tools/kvproxyctl/kvproxyctl KVPROXY_BENCH=$B/tools/bench/kvproxy-bench
# shellcheck source=../../tests/integ/lib.sh
. "$ROOT/tests/integ/lib.sh"
KVP_TEST=bench_gpu
"$GPU_CLIENT" probe || exit $?
require_bins
init_test

"$GPU_CLIENT" copybench
# The same copies as kvproxy's staging path makes them, without the wire.
"$B/tools/bench/kvp-stage-copy-bench" -b 1048576
"$B/tools/bench/kvp-stage-copy-bench" -b 4194304
G=1073741824
# Each daemon's main and worker lcores on CPUs of their own (prefill 0,1;
# decode 2,3), as on two hosts: with KVP_EAL's "-l 0,1" for both, the two
# workers shared CPU 1 and the GPU-to-GPU figure halved.
export KVP_EAL_NO_LCORES=1 KVP_EAL_PREFILL=${KVP_EAL_PREFILL:--l 0,1} KVP_EAL_DECODE=${KVP_EAL_DECODE:--l 2,3}
log "lcores: prefill0 $KVP_EAL_PREFILL, decode0 $KVP_EAL_DECODE (main first, then the worker)"
for stage in 'stage = { pool = 67108864; buffer = 1048576; };' \
	'stage = { pool = 134217728; buffer = 4194304; };'; do
	echo "== $stage"
	loopback_pair "$stage"
	for seg in 4194304 65536; do
		per=$((seg >= 1048576 ? 64 : 1024))
		spawn "" "$KVP_TMP/d" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" --size $G \
			--seed 1 --key-file "$KVP_TMP/k" --min-seg $seg --max-seg $seg --linear --segs-per-xfer $per
		d=$SPAWNED
		printf 'host memory, %s-byte segments: ' $seg
		"$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 --key-file "$KVP_TMP/k" \
			--size $G --seed 1 --min-seg $seg --max-seg $seg --linear --segs-per-xfer $per 2>&1 | tail -1
		wait_pid $d 120 || fail "host decode failed"
		spawn "" "$KVP_TMP/g" - "$GPU_CLIENT" decode -s "$(sock_of decode0)" -k "$KVP_TMP/gk" -n $G
		d=$SPAWNED
		printf 'GPU memory, %s-byte pages: ' $seg
		"$GPU_CLIENT" prefill -s "$(sock_of prefill0)" -k "$KVP_TMP/gk" -n $G -p decode0 \
			--page $seg --pages-per-xfer $per --inflight 4 | tail -1
		wait_pid $d 120 || fail "GPU decode failed"
		tail -1 "$KVP_TMP/g"
	done
	stop_daemon_checked prefill0
	stop_daemon_checked decode0
done
