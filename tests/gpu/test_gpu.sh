#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# gpu suite: KV pages in GPU memory move prefill0 -> decode0 through the
# TCP staging path (device -> pinned pool -> wire -> pinned pool -> device)
# and are verified on the GPU side. Two kvproxyd on loopback (the GPU host
# has no iproute2). Skips (77) where there is no usable GPU.
# Asserts: mixed 64 KiB pages and multi-MiB blocks land byte-exact through
# both handle kinds (CUDA IPC, VMM POSIX fd); a client that dies while its
# GPU regions are registered is reclaimed; a pool much smaller than the data
# in flight only slows transfers down; a tiny pool with a short admission
# time fails them cleanly with "no-buffers" and the daemon keeps serving.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../integ/lib.sh
. "$(dirname "$0")/../integ/lib.sh"

[[ -n ${GPU_CLIENT:-} && -x ${GPU_CLIENT:-} ]] || setup_fail "\$GPU_CLIENT is not set (meson sets it)"
rc=0
"$GPU_CLIENT" probe || rc=$?
[[ $rc -eq 0 ]] || { [[ $rc -eq 77 ]] && skip "no usable GPU here"; setup_fail "GPU probe failed ($rc)"; }
require_bins
init_test

# gpu_xfer TAG SIZE SEED PAGE PER_XFER [prefill args...]: decode + prefill, both on GPU memory.
gpu_xfer() {
	local tag=$1 size=$2 seed=$3 page=$4 per=$5
	shift 5
	spawn "" "$KVP_TMP/dec.$tag" - "$GPU_CLIENT" decode -s "$(sock_of decode0)" \
		-k "$KVP_TMP/key.$tag" -n "$size" --seed "$seed" ${DEC_VMM:+--vmm} --timeout 120
	local dec=$SPAWNED
	"$GPU_CLIENT" prefill -s "$(sock_of prefill0)" -k "$KVP_TMP/key.$tag" -n "$size" \
		-p decode0 --seed "$seed" --page "$page" --pages-per-xfer "$per" "$@" \
		>"$KVP_TMP/pre.$tag" 2>&1 || { cat "$KVP_TMP/pre.$tag" >&2; fail "$tag: prefill failed"; }
	cat "$KVP_TMP/pre.$tag" >&2
	wait_pid "$dec" 150 || { cat "$KVP_TMP/dec.$tag" >&2; fail "$tag: decode did not verify"; }
	cat "$KVP_TMP/dec.$tag" >&2
	grep -q " 0 mismatches" "$KVP_TMP/dec.$tag" || fail "$tag: GPU data mismatch"
}

loopback_pair 'stage = { pool = 67108864; buffer = 1048576; };'
gpu_xfer ipc-pages 268435456 11 65536 256
DEC_VMM=1 gpu_xfer vmm-blocks 268435456 12 8388608 4 --vmm
gpu_xfer ipc-odd 50331648 13 4096 1024 --vmm

# A client dies with GPU regions registered: they are unmapped, the node serves on.
spawn "" "$KVP_TMP/dec.victim" - "$GPU_CLIENT" decode -s "$(sock_of decode0)" \
	-k "$KVP_TMP/key.victim" -n 67108864 --timeout 120
VICTIM=$SPAWNED
wait_file "$KVP_TMP/key.victim" 60 "$VICTIM"
wait_json decode0 status 'd["regions"] >= 1' 30 "the victim's GPU region is registered"
kill -KILL "$VICTIM"
untrack "$VICTIM"
wait "$VICTIM" 2>/dev/null || true
wait_json decode0 status 'd["clients"] == 0 and d["regions"] == 0' 30 \
	"GPU regions of the dead client reclaimed"
stop_daemon_checked prefill0
stop_daemon_checked decode0

# Pool far smaller than the data in flight: slower, never failing.
loopback_pair 'stage = { pool = 4194304; buffer = 1048576; };'
gpu_xfer small-pool 134217728 14 65536 256 --inflight 16 --timeout-ms 60000
for n in prefill0 decode0; do
	wait_json "$n" stats "d['staging']['in_use'] == 0" 30 "$n staging pool whole again"
done
stop_daemon_checked prefill0
stop_daemon_checked decode0

# Tiny pool, short admission time: transfers fail with no-buffers, cleanly.
KVP_TIMEOUTS_EXTRA="admission_ms = 50;"
loopback_pair 'stage = { pool = 262144; buffer = 65536; };'
spawn "" "$KVP_TMP/dec.tiny" - "$GPU_CLIENT" decode -s "$(sock_of decode0)" \
	-k "$KVP_TMP/key.tiny" -n 268435456 --timeout 30
DEC=$SPAWNED
"$GPU_CLIENT" prefill -s "$(sock_of prefill0)" -k "$KVP_TMP/key.tiny" -n 268435456 -p decode0 \
	--page 4194304 --pages-per-xfer 4 --inflight 16 --expect fail >"$KVP_TMP/pre.tiny" 2>&1 ||
	{ cat "$KVP_TMP/pre.tiny" >&2; fail "tiny pool: expected some transfers to fail"; }
grep -q "no-buffers" "$KVP_TMP/pre.tiny" || fail "tiny pool: no 'no-buffers' failure reported"
stop_pid "$DEC" 5 || true
untrack "$DEC"
wait_json prefill0 stats "d['staging']['in_use'] == 0 and d['totals']['inflight'] == 0" 30 \
	"prefill0 pool whole again after the failures"
KVP_TIMEOUTS_EXTRA=""
stop_daemon_checked prefill0
stop_daemon_checked decode0
