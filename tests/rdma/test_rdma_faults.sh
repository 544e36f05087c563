#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Runs inside the Soft-RoCE VM (tools/rdma-vm.sh). RDMA transport under faults:
#   --mode pause  two rails; rail 1 is paused mid-run: no new WRITE goes
#                 through it (its counter stops within one window), rail 0
#                 carries the rest, every byte is verified; resumed, both
#                 carry traffic again.
#   --mode loss   one rail across the veth pair with netem loss 1 % (RC
#                 retransmits): every byte verified, no transfer failed.
#   --mode kill   kill -9 of decode0 mid-transfer: every prefill transfer
#                 ends ok or with a peer error (not a timeout) and nothing
#                 stays in flight; decode0 restarts, the QPs are rebuilt and
#                 a fresh transfer is verified.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../integ/lib.sh
. "$(dirname "$0")/../integ/lib.sh"

MODE=""
while [[ $# -gt 0 ]]; do
	case $1 in
	--mode) MODE=$2; shift ;;
	*) setup_fail "unknown argument $1" ;;
	esac
	shift
done
[[ $MODE == pause || $MODE == loss || $MODE == kill ]] || setup_fail "--mode pause|loss|kill"
[[ ${KVP_RDMA_VM:-} == 1 ]] || skip "runs inside the Soft-RoCE VM (tools/rdma-vm.sh)"
require_bins
init_test

WINDOW=$((1 << 20))
if [[ $MODE == pause ]]; then
	DEV_P="$KVP_RDMA_DEV0,$KVP_RDMA_DEV1"
	DEV_D=$DEV_P
	RAILS=2
else
	DEV_P=$KVP_RDMA_DEV0
	DEV_D=$KVP_RDMA_DEV1
	RAILS=1
fi
KVP_TRANSPORT=rdma
KVP_PEER_MS=${KVP_PEER_MS:-3000} # emulated CPUs: room between heartbeats
export KVP_TRANSPORT KVP_PEER_MS
write_conf prefill0 "$KVP_RDMA_IP0:7400" decode0 "$KVP_RDMA_IP1:7400" \
	"rdma = { devices = \"$DEV_P\"; chunk = 262144; window = $WINDOW; };"
write_conf decode0 "$KVP_RDMA_IP1:7400" prefill0 "$KVP_RDMA_IP0:7400" \
	"rdma = { devices = \"$DEV_D\"; chunk = 262144; window = $WINDOW; };"

up_pair "" ""
qps_up() {
	wait_json prefill0 stats "sum(r['qps_up'] for r in d['rdma']['rails']) == $RAILS * $KVP_WORKERS" 60 \
		"prefill0: $RAILS send QP(s) up per worker"
}
qps_up
# With several workers the decode client sits on worker 1 (see lib.sh).
occupy_worker0 decode0 ""

# transfer TAG SIZE: decode + prefill clients in the background (DEC, PRE).
transfer() {
	local tag=$1 size=$2
	spawn "" "$KVP_TMP/decode.$tag.out" "$KVP_TMP/decode.$tag.err" "$KVPROXY_BENCH" decode \
		-s "$(sock_of decode0)" --size "$size" --seed 7 --key-file "$KVP_TMP/key.$tag" \
		--timeout 300 --json --min-seg 65536 --max-seg 2097152
	DEC=$SPAWNED
	spawn "" "$KVP_TMP/prefill.$tag.out" "$KVP_TMP/prefill.$tag.err" "$KVPROXY_BENCH" prefill \
		-s "$(sock_of prefill0)" --peer decode0 --key-file "$KVP_TMP/key.$tag" --size "$size" \
		--seed 7 --min-seg 65536 --max-seg 2097152 --inflight 4 --wait-key 60 --json
	PRE=$SPAWNED
}

# verified TAG SIZE: both clients ended well and every byte was checked.
verified() {
	local tag=$1 size=$2 rc=0
	wait_pid "$PRE" 400 || rc=$?
	[[ $rc -eq 0 ]] || fail "$tag: prefill client exit $rc: $(cat "$KVP_TMP/prefill.$tag.out" "$KVP_TMP/prefill.$tag.err")"
	wait_pid "$DEC" 120 || rc=$?
	[[ $rc -eq 0 ]] || fail "$tag: decode client exit $rc: $(cat "$KVP_TMP/decode.$tag.err")"
	json_check "$KVP_TMP/decode.$tag.out" "d['bytes'] == $size and d['mismatches'] == 0" \
		"$tag: decode client did not verify $size bytes"
	log "$tag: $size bytes verified"
}

rail_bytes() { # rail_bytes FILE RAIL
	json_get "$1" "[r['tx_bytes'] for r in d['rdma']['rails'] if r['rail'] == $2][0]"
}

case $MODE in
pause)
	SIZE=$((64 << 20))
	transfer pause "$SIZE"
	wait_json prefill0 stats "sum(r['tx_bytes'] for r in d['rdma']['rails']) >= $((SIZE / 8))" 120 \
		"an eighth of the data on the rails"
	"$KVPROXYCTL" -s "$(admin_of prefill0)" rail_pause 1 >"$KVP_TMP/pause.out" ||
		fail "rail_pause 1 refused: $(cat "$KVP_TMP/pause.out")"
	stats_json prefill0 >"$KVP_TMP/at_pause.json"
	AT=$(rail_bytes "$KVP_TMP/at_pause.json" 1)
	log "rail 1 paused at $AT bytes"
	verified pause "$SIZE"
	stats_json prefill0 >"$KVP_TMP/after.json"
	AFTER=$(rail_bytes "$KVP_TMP/after.json" 1)
	log "rail 1 after the run: $AFTER bytes (window $WINDOW)"
	# WRITEs already posted complete; nothing new goes through the paused rail.
	[[ $((AFTER - AT)) -le $WINDOW ]] || fail "rail 1 carried $((AFTER - AT)) bytes after the pause (window $WINDOW)"
	json_check "$KVP_TMP/after.json" "[r for r in d['rdma']['rails'] if r['rail'] == 1][0]['paused'] and d['rdma']['tcp_fallbacks'] == 0" \
		"rail 1 not reported paused, or transfers fell back to TCP"
	"$KVPROXYCTL" -s "$(admin_of prefill0)" rail_resume 1 >/dev/null || fail "rail_resume 1 refused"
	transfer resumed $((16 << 20))
	verified resumed $((16 << 20))
	stats_json prefill0 >"$KVP_TMP/resumed.json"
	[[ $(rail_bytes "$KVP_TMP/resumed.json" 1) -gt $AFTER ]] || fail "rail 1 carried nothing after rail_resume"
	"$KVPROXYCTL" -s "$(admin_of prefill0)" rail_pause 5 >/dev/null 2>&1 && fail "rail_pause of a rail that does not exist succeeded"
	log "rail_pause of an unknown rail refused"
	;;
loss)
	tc qdisc add dev "$KVP_RDMA_NETDEV0" root netem loss 1% || setup_fail "tc netem unavailable in the VM kernel"
	tc qdisc add dev "$KVP_RDMA_NETDEV1" root netem loss 1% || setup_fail "tc netem unavailable in the VM kernel"
	SIZE=$((32 << 20))
	transfer loss "$SIZE"
	verified loss "$SIZE"
	stats_json prefill0 >"$KVP_TMP/loss.json"
	json_check "$KVP_TMP/loss.json" "d['rdma']['xfers'] == d['completions']['ok'] and sum(v for k, v in d['completions'].items() if k != 'ok') == 0" \
		"transfers under loss did not all complete by RDMA"
	tc qdisc del dev "$KVP_RDMA_NETDEV0" root
	tc qdisc del dev "$KVP_RDMA_NETDEV1" root
	;;
kill)
	SIZE=$((256 << 20))
	transfer kill "$SIZE"
	# Poll with grep, not python: in the emulated VM python takes seconds to start,
	# and the fault must hit while most of the data is still to come.
	dl=$(deadline_in 120)
	landed=0
	while before "$dl" && [[ $landed -lt 1 ]]; do
		# The first "xfers_landed" is the node's (totals); the workers' rows follow.
		landed=$(ctl decode0 --json stats 2>/dev/null | grep -o '"xfers_landed": *[0-9]*' |
			head -1 | grep -o '[0-9]*$' || echo 0)
		[[ $landed -ge 1 ]] || sleep "$KVP_POLL"
	done
	[[ $landed -ge 1 ]] || fail "decode0 landed nothing within 120 s"
	kill -KILL "${DPID[decode0]}"
	untrack "${DPID[decode0]}"
	wait "${DPID[decode0]}" 2>/dev/null || true
	rc=0
	wait_pid "$PRE" 120 || rc=$?
	[[ $rc -eq 1 ]] || fail "prefill client exit $rc, expected 1 (failed transfers): $(cat "$KVP_TMP/prefill.kill.out")"
	json_check "$KVP_TMP/prefill.kill.out" \
		"d['status']['peer'] > 0 and d['status']['ok'] + d['status']['peer'] == d['xfers']" \
		"transfers must end ok or with a peer error (not time out)"
	wait_json prefill0 status 'd["inflight"] == 0' 30 "no transfer left in flight"
	wait_pid "$DEC" 60 || true # its daemon is gone
	log "decode0 killed: transfers ended with peer errors"
	start_daemon decode0 ""
	wait_admin decode0
	wait_peer_up prefill0 decode0 60
	qps_up
	stats_json prefill0 >"$KVP_TMP/before.json"
	BEFORE=$(json_get "$KVP_TMP/before.json" "d['rdma']['xfers']")
	transfer again $((16 << 20))
	verified again $((16 << 20))
	stats_json prefill0 >"$KVP_TMP/again.json"
	AGAIN=$(json_get "$KVP_TMP/prefill.again.out" "d['xfers']")
	json_check "$KVP_TMP/again.json" "d['rdma']['xfers'] == $BEFORE + $AGAIN" \
		"the $AGAIN transfers after the restart did not all go by RDMA"
	;;
esac
stop_daemon_checked prefill0
stop_daemon_checked decode0
log "PASS"
