#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Runs inside the Soft-RoCE VM (tools/rdma-vm.sh). The ways RDMA is refused,
# each ending in verified data over the TCP staging path instead:
#  1. dma-buf registration refused: decode0 registers its regions with
#     ibv_reg_dmabuf_mr, the GPUDirect call (rdma.dmabuf_host), which
#     Soft-RoCE refuses (EOPNOTSUPP); the refusal is counted with its
#     reason, the grant says "not registered" and every transfer falls back
#     to TCP.
#  2. A peer without RDMA: decode0 restarts with transport = "tcp"; it tells
#     prefill0 so, and transfers go over TCP from the start.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../integ/lib.sh
. "$(dirname "$0")/../integ/lib.sh"

[[ ${KVP_RDMA_VM:-} == 1 ]] || skip "runs inside the Soft-RoCE VM (tools/rdma-vm.sh)"
require_bins
init_test
KVP_PEER_MS=${KVP_PEER_MS:-3000} # emulated CPUs: room between heartbeats
export KVP_PEER_MS
SIZE=$((16 << 20))

KVP_TRANSPORT=rdma write_conf prefill0 "$KVP_RDMA_IP0:7400" decode0 "$KVP_RDMA_IP1:7400" \
	"rdma = { devices = \"$KVP_RDMA_DEV0\"; };"
KVP_TRANSPORT=rdma write_conf decode0 "$KVP_RDMA_IP1:7400" prefill0 "$KVP_RDMA_IP0:7400" \
	"rdma = { devices = \"$KVP_RDMA_DEV1\"; dmabuf_host = true; };"
up_pair "" ""
wait_json prefill0 stats "sum(r['qps_up'] for r in d['rdma']['rails']) == 1" 60 "prefill0: send QP up"

# move TAG: one verified transfer run; XF = its transfer count.
move() {
	local tag=$1 rc=0
	spawn "" "$KVP_TMP/decode.$tag.out" "$KVP_TMP/decode.$tag.err" "$KVPROXY_BENCH" decode \
		-s "$(sock_of decode0)" --size "$SIZE" --seed 3 --key-file "$KVP_TMP/key.$tag" \
		--timeout 300 --json
	DEC=$SPAWNED
	timeout -k 5 320 "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
		--key-file "$KVP_TMP/key.$tag" --size "$SIZE" --seed 3 --wait-key 60 --json \
		>"$KVP_TMP/prefill.$tag.out" 2>"$KVP_TMP/prefill.$tag.err" || rc=$?
	[[ $rc -eq 0 ]] || fail "$tag: prefill client exit $rc: $(cat "$KVP_TMP/prefill.$tag.out" "$KVP_TMP/prefill.$tag.err")"
	wait_pid "$DEC" 120 || fail "$tag: decode client failed: $(cat "$KVP_TMP/decode.$tag.err")"
	json_check "$KVP_TMP/decode.$tag.out" "d['bytes'] == $SIZE and d['mismatches'] == 0" \
		"$tag: decode client did not verify $SIZE bytes"
	XF=$(json_get "$KVP_TMP/prefill.$tag.out" "d['xfers']")
	log "$tag: $XF transfers, $SIZE bytes verified"
}

# 1. dma-buf refused on the receiver.
move dmabuf
stats_json decode0 >"$KVP_TMP/d.json"
json_check "$KVP_TMP/d.json" "d['rdma']['registrations']['failed'] >= 1 and d['rdma']['registrations']['registered'] == 0 and 'ibv_reg_dmabuf_mr' in d['rdma']['registrations']['last_error'] and 'not supported' in d['rdma']['registrations']['last_error']" \
	"decode0: the dma-buf registration was not refused with a reason"
log "decode0: $(json_get "$KVP_TMP/d.json" "d['rdma']['registrations']['last_error']")"
stats_json prefill0 >"$KVP_TMP/p.json"
json_check "$KVP_TMP/p.json" "d['rdma']['tcp_fallbacks'] == $XF and d['completions']['ok'] == $XF and sum(r['tx_bytes'] for r in d['rdma']['rails']) == 0" \
	"prefill0: transfers did not all fall back to TCP"
P1=$(json_get "$KVP_TMP/p.json" "d['rdma']['xfers']")

# 2. decode0 comes back without RDMA.
stop_daemon_checked decode0
KVP_TRANSPORT=tcp write_conf decode0 "$KVP_RDMA_IP1:7400" prefill0 "$KVP_RDMA_IP0:7400"
start_daemon decode0 ""
wait_admin decode0
wait_peer_up prefill0 decode0 60
wait_peer_up decode0 prefill0 60
move tcp_peer
stats_json prefill0 >"$KVP_TMP/p2.json"
json_check "$KVP_TMP/p2.json" "d['rdma']['xfers'] == $P1 and d['completions']['ok'] == 2 * $XF and sum(v for k, v in d['completions'].items() if k != 'ok') == 0" \
	"prefill0: transfers to a peer without RDMA did not go over TCP"
grep -q "has no RDMA" "$KVP_TMP/prefill0.log" || fail "prefill0 did not log that decode0 has no RDMA"
stop_daemon_checked prefill0
stop_daemon_checked decode0
log "PASS"
