#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Runs inside the Soft-RoCE VM (tools/rdma-vm.sh). Asserts: two kvproxyd,
# prefill0 on rxe0 (10.99.0.1) and decode0 on rxe1 (10.99.0.2), move SIZE
# bytes in mixed segments over the RDMA transport with every byte verified;
# every transfer went by RDMA (none fell back to TCP), and the per-rail
# counters add up to the bytes moved. With --rails 2 both daemons use both
# devices and the stripes must show on both rails.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../integ/lib.sh
. "$(dirname "$0")/../integ/lib.sh"

RAILS=1
SIZE=$((64 << 20))
while [[ $# -gt 0 ]]; do
	case $1 in
	--rails) RAILS=$2; shift ;;
	--size) SIZE=$2; shift ;;
	*) setup_fail "unknown argument $1" ;;
	esac
	shift
done
SEED=${KVP_SEED:-$RANDOM}

[[ ${KVP_RDMA_VM:-} == 1 ]] || skip "runs inside the Soft-RoCE VM (tools/rdma-vm.sh)"
require_bins
init_test

if [[ $RAILS == 2 ]]; then
	DEV_P="$KVP_RDMA_DEV0,$KVP_RDMA_DEV1"
	DEV_D="$KVP_RDMA_DEV0,$KVP_RDMA_DEV1"
	CHUNK=262144 # stripes of 256 KiB, so that most transfers span both rails
else
	DEV_P=$KVP_RDMA_DEV0
	DEV_D=$KVP_RDMA_DEV1
	CHUNK=1048576
fi
KVP_TRANSPORT=rdma
# Emulated CPUs (TCG): allow the worker loops more time between heartbeats.
KVP_PEER_MS=${KVP_PEER_MS:-3000}
export KVP_TRANSPORT KVP_PEER_MS
write_conf prefill0 "$KVP_RDMA_IP0:7400" decode0 "$KVP_RDMA_IP1:7400" \
	"rdma = { devices = \"$DEV_P\"; chunk = $CHUNK; };"
write_conf decode0 "$KVP_RDMA_IP1:7400" prefill0 "$KVP_RDMA_IP0:7400" \
	"rdma = { devices = \"$DEV_D\"; chunk = $CHUNK; };"
up_pair "" ""
# Every worker builds its own send QPs (KVP_WORKERS per daemon, 1 by default).
wait_json prefill0 stats "sum(r['qps_up'] for r in d['rdma']['rails']) == $RAILS * $KVP_WORKERS" 60 \
	"prefill0: $RAILS send QP(s) up per worker"
# With several workers the decode client sits on worker 1: the WRITEs land
# through worker 0's queue pairs and every landing notice crosses.
occupy_worker0 decode0 ""

KEY="$KVP_TMP/decode.key"
log "decode client: $SIZE bytes, seed $SEED, $RAILS rail(s)"
spawn "" "$KVP_TMP/decode.out" "$KVP_TMP/decode.err" "$KVPROXY_BENCH" decode \
	-s "$(sock_of decode0)" --size "$SIZE" --seed "$SEED" --key-file "$KEY" --timeout 400 --json \
	--min-seg 4096 --max-seg 4194304
DEC=$SPAWNED
prc=0
timeout -k 5 420 "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KEY" --size "$SIZE" --seed "$SEED" --min-seg 4096 --max-seg 4194304 \
	--wait-key 60 --json >"$KVP_TMP/prefill.out" 2>"$KVP_TMP/prefill.err" || prc=$?
cat "$KVP_TMP/prefill.err" >&2
[[ $prc -eq 0 ]] || fail "prefill client exited with $prc: $(cat "$KVP_TMP/prefill.out")"
drc=0
wait_pid "$DEC" 120 || drc=$?
cat "$KVP_TMP/decode.err" >&2
[[ $drc -eq 0 ]] || fail "decode client exited with $drc: $(cat "$KVP_TMP/decode.out")"

XFERS=$(json_get "$KVP_TMP/prefill.out" 'd["xfers"]')
json_check "$KVP_TMP/decode.out" "d['bytes'] == $SIZE and d['mismatches'] == 0 and d['xfers'] == $XFERS" \
	"decode client did not verify $SIZE bytes in $XFERS transfers"
log "clients: $XFERS transfers, $SIZE bytes verified; $(json_get "$KVP_TMP/prefill.out" 'd["gbps"]') Gbit/s"

stats_json prefill0 >"$KVP_TMP/p.stats"
stats_json decode0 >"$KVP_TMP/d.stats"
json_check "$KVP_TMP/p.stats" "d['completions']['ok'] == $XFERS and d['rdma']['xfers'] == $XFERS and d['rdma']['tcp_fallbacks'] == 0" \
	"prefill0: not every transfer went by RDMA"
json_check "$KVP_TMP/p.stats" "sum(r['tx_bytes'] for r in d['rdma']['rails']) == $SIZE" \
	"prefill0: rail tx_bytes do not add up to $SIZE"
json_check "$KVP_TMP/d.stats" "sum(r['rx_notices'] for r in d['rdma']['rails']) == $XFERS and d['totals']['xfers_landed'] == $XFERS" \
	"decode0: landing notices != $XFERS"
json_check "$KVP_TMP/p.stats" "d['rdma']['registrations']['registered'] >= 1 and d['rdma']['registrations']['failed'] == 0" \
	"prefill0: source region not registered"
if [[ $RAILS == 2 ]]; then
	json_check "$KVP_TMP/p.stats" "all(r['tx_bytes'] > $SIZE // 8 for r in d['rdma']['rails'])" \
		"prefill0: striping did not use both rails"
fi
log "rails: $(json_get "$KVP_TMP/p.stats" "[r['tx_bytes'] for r in d['rdma']['rails']]")"
if [[ $KVP_WORKERS -gt 1 ]]; then
	json_check "$KVP_TMP/d.stats" "d['workers'][0]['landings_forwarded'] == $XFERS" \
		"decode0: worker 0 should have handed every landing notice to worker 1"
	release_worker0 decode0
fi
stop_daemon_checked prefill0
stop_daemon_checked decode0
log "PASS"
