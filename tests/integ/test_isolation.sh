#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Client isolation (issue 7), with a hand-written rogue client ($ROGUE_CLIENT,
# tests/isolation/rogue_client.c) next to honest kvproxy-bench clients:
#   - region keys are random 64-bit values, not counters;
#   - a client that writes garbage into its own submission ring (random
#     entries, producer index moved back or past the ring, a header promising
#     entries that are not there, a completion index past the producer) is
#     disconnected with a logged reason that names the index or count it
#     wrote, while an honest pair's transfer on the same node goes on and
#     verifies every byte; both daemons live on;
#   - a transfer naming another client's region, or a region of a client that
#     has gone away, fails "invalid" (source on this node) or "remote"
#     (destination on the other node), sends nothing and changes no byte of
#     either region; a transfer with timeout_ns = UINT64_MAX completes;
#   - everything is reclaimed afterwards.
# With an argument it runs one more case instead (each a separate meson test):
#   cq-pin    a client that moves its completion-ring consumer index back a
#             whole ring after submitting must not keep the node's transfer
#             slots: an honest client submitting afterwards still succeeds;
#   truncate  a client that shrinks the memfd of a registered region (source
#             or destination) must not crash kvproxyd, zero-copy or staged:
#             its transfers fail, the node lives, honest pairs still verify.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

CASE=${1:-main}
KVP_TEST=test_isolation${CASE:+_$CASE}
KVP_TEST=${KVP_TEST%_main}

require_netns
require_bins
[[ -n ${ROGUE_CLIENT:-} && -x ${ROGUE_CLIENT:-} ]] ||
	setup_fail "\$ROGUE_CLIENT is not set (tests/isolation/meson.build sets it; run through 'meson test')"
init_test

rogue() { "$ROGUE_CLIENT" "$@"; }

# hold NODE NS TAG SIZE SEED: an honest region owner in the background; sets HOLD_PID,
# its key in $KVP_TMP/TAG.key; stop it with release TAG.
hold() {
	local node=$1 ns=$2 tag=$3
	spawn "$ns" "$KVP_TMP/$tag.hold.out" - "$ROGUE_CLIENT" hold -s "$(sock_of "$node")" \
		--key-file "$KVP_TMP/$tag.key" --size "$4" --seed "$5" \
		--stop-file "$KVP_TMP/$tag.stop" --timeout 300
	HOLD_PID=$SPAWNED
	wait_file "$KVP_TMP/$tag.key" 30 "$HOLD_PID"
}

# release TAG PID: the owner checks its region and exits; it must find it intact.
release() {
	local rc=0
	touch "$KVP_TMP/$1.stop"
	wait_pid "$2" 30 || rc=$?
	cat "$KVP_TMP/$1.hold.out" >&2
	[[ $rc -eq 0 ]] || fail "region of $1 was modified (owner exit $rc)"
	grep -q "intact" "$KVP_TMP/$1.hold.out" || fail "owner $1 did not report its region intact"
}

tx_bytes() {
	stats_json prefill0 >"$KVP_TMP/tx.json" && json_get "$KVP_TMP/tx.json" "peer('decode0')['tx_bytes']"
}

# expect_disconnect NODE NS MODE SEED: a rogue scribbles on its rings and must be cut off,
# with a reason in NODE's log naming its pid.
expect_disconnect() {
	local node=$1 ns=$2 mode=$3 out="$KVP_TMP/rogue.$1.$3.out" rc=0 pid
	spawn "$ns" "$out" - "$ROGUE_CLIENT" garbage -s "$(sock_of "$node")" --mode "$mode" \
		--seed "$4" --timeout 15
	pid=$SPAWNED
	wait_pid "$pid" 60 || rc=$?
	cat "$out" >&2
	[[ $rc -eq 0 ]] || fail "rogue ($mode) on $node was not disconnected (exit $rc)"
	local dl line wrote what
	dl=$(deadline_in 10)
	until grep -q "(pid $pid) broke the ring protocol" "$KVP_TMP/$node.log"; do
		before "$dl" || fail "$node logged no reason for disconnecting rogue pid $pid ($mode)"
		sleep "$KVP_POLL"
	done
	line=$(grep "(pid $pid) broke the ring protocol" "$KVP_TMP/$node.log" | head -n 1)
	# The reason names the offending value: the one the rogue says it wrote, if it says.
	wrote=$(grep -o 'wrote [a-z.]* = [0-9]*' "$out" || true)
	case $wrote in
	"wrote sq.prod = "*) what="SQ producer index ${wrote##* } " ;;
	"wrote cq.cons = "*) what="CQ consumer index ${wrote##* } " ;;
	"wrote nseg = "*) what="nseg ${wrote##* }," ;;
	*) what="" ;;
	esac
	if [[ -n $what ]]; then
		[[ $line == *"$what"* ]] || fail "$node's reason for the $mode rogue does not name '$what': $line"
	else
		[[ $line =~ index\ [0-9]+ ]] || fail "$node's reason for the $mode rogue names no index: $line"
	fi
	log "$node disconnected the $mode rogue: ${line#*broke the ring protocol }"
	daemon_alive prefill0 || fail "prefill0 died after the $mode rogue"
	daemon_alive decode0 || fail "decode0 died after the $mode rogue"
}

reclaimed() {
	wait_json "$1" status 'd["clients"] == 0 and d["regions"] == 0 and d["inflight"] == 0' 60 \
		"clients, regions and transfers of $1 reclaimed"
}

case_main() {
	start_pair 71

	# ---- region keys: random, not counters ----
	in_ns "$NS_P" "$ROGUE_CLIENT" keys -s "$(sock_of prefill0)" >"$KVP_TMP/keys.out" 2>&1 ||
		{ cat "$KVP_TMP/keys.out" >&2; fail "region keys are not random in their high bits"; }
	cat "$KVP_TMP/keys.out" >&2

	# ---- garbage in the rings, with an honest pair moving data on both nodes ----
	if ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate 1gbit burst 256kb latency 50ms 2>/dev/null; then
		SHAPED=1 # keeps the honest transfer running while the rogues act
	else
		SHAPED=0
	fi
	honest_pair during 268435456 7
	wait_json prefill0 stats "peer('decode0')['tx_bytes'] > 0" 60 "honest transfer moving"
	local seed=1 m
	for m in random backwards past nseg cqcons; do
		expect_disconnect prefill0 "$NS_P" "$m" $((seed++))
	done
	expect_disconnect decode0 "$NS_D" random 9
	expect_disconnect decode0 "$NS_D" past 10
	# Each one counted as a ring-protocol violation (issue 16).
	wait_json prefill0 stats "d['totals']['ring_violations'] == 5" 10 "prefill0's 5 ring violations counted"
	wait_json decode0 stats "d['totals']['ring_violations'] == 2" 10 "decode0's 2 ring violations counted"
	ctl prefill0 stats --prometheus | grep -q '^kvproxy_ring_violations_total{node="prefill0"} 5$' ||
		fail "Prometheus: kvproxy_ring_violations_total of prefill0 is not 5"
	honest_done during 268435456
	[[ $SHAPED -eq 0 ]] || ip netns exec "$NS_P" tc qdisc del dev "$VETH_P" root

	# ---- other clients' regions, live and gone ----
	hold prefill0 "$NS_P" victim 1048576 21
	VICTIM=$HOLD_PID
	hold decode0 "$NS_D" dest 1048576 22
	DEST=$HOLD_PID
	hold prefill0 "$NS_P" gone 1048576 23
	release gone "$HOLD_PID"
	hold decode0 "$NS_D" gonedst 1048576 24
	release gonedst "$HOLD_PID"
	wait_json prefill0 status 'd["regions"] == 1' 30 "the departed client's region removed on prefill0"
	wait_json decode0 status 'd["regions"] == 1' 30 "the departed client's region removed on decode0"

	local tx0 tx1 vkey dkey gkey gdkey
	vkey=$(cat "$KVP_TMP/victim.key")
	dkey=$(cat "$KVP_TMP/dest.key")
	gkey=$(sed -n 1p "$KVP_TMP/gone.hold.out" | grep -o '0x[0-9a-f]*' | head -n 1)
	gdkey=$(sed -n 1p "$KVP_TMP/gonedst.hold.out" | grep -o '0x[0-9a-f]*' | head -n 1)
	[[ -n $gkey && -n $gdkey ]] || setup_fail "departed clients' keys not found"
	tx0=$(tx_bytes)
	steal() {
		local what=$1
		shift
		in_ns "$NS_P" "$ROGUE_CLIENT" steal -s "$(sock_of prefill0)" --peer decode0 "$@" \
			--timeout 30 >"$KVP_TMP/steal.out" 2>&1 || {
			cat "$KVP_TMP/steal.out" >&2
			fail "$what"
		}
		cat "$KVP_TMP/steal.out" >&2
	}
	steal "another live client's source region must be refused" \
		--src-key "$vkey" --dst-key "$dkey" --len 65536 --expect invalid
	steal "a departed client's source region must be refused" \
		--src-key "$gkey" --dst-key "$dkey" --len 65536 --expect invalid
	steal "a key one slot away from a live region must be refused" \
		--src-key "$(printf '0x%016x' $((vkey ^ 1)))" --dst-key "$dkey" --expect invalid
	tx1=$(tx_bytes)
	[[ $tx0 == "$tx1" ]] || fail "refused transfers sent $((tx1 - tx0)) bytes to decode0"
	log "refused source regions: nothing sent (tx_bytes stayed $tx0)"
	steal "a departed client's destination region must be refused by the remote" \
		--src-key own --own-size 65536 --dst-key "$gdkey" --len 65536 --expect remote
	steal "a range past the end of the destination region must be refused by the remote" \
		--src-key own --own-size 2097152 --dst-key "$dkey" --len 2097152 --expect remote
	release victim "$VICTIM"
	release dest "$DEST"
	log "the victim's and the destination's regions are intact"

	# timeout_ns = UINT64_MAX means no deadline: it saturates instead of wrapping
	# into the past (which failed the transfer "timeout" as soon as it was picked up).
	hold decode0 "$NS_D" far 1048576 25
	local far=$HOLD_PID rc=0
	steal "a transfer with timeout_ns = UINT64_MAX must complete, not expire at once" \
		--src-key own --own-size 65536 --dst-key "$(cat "$KVP_TMP/far.key")" --len 65536 \
		--xfer-timeout-ns 18446744073709551615 --expect ok
	touch "$KVP_TMP/far.stop"
	wait_pid "$far" 30 || rc=$?
	cat "$KVP_TMP/far.hold.out" >&2
	# The owner exits 1 when its region changed: here, because the bytes landed.
	[[ $rc -eq 1 ]] || fail "the region owner exited $rc, expected 1 (region changed)"
	grep -q CHANGED "$KVP_TMP/far.hold.out" ||
		fail "the transfer without a deadline reported ok, but its bytes did not land"

	# ---- service as usual, everything reclaimed ----
	honest_pair after 33554432 8
	honest_done after 33554432
	reclaimed prefill0
	reclaimed decode0
	stop_daemon_checked prefill0
	stop_daemon_checked decode0
}

case_cq_pin() {
	start_pair 72
	# Slow enough that the rogue's transfers are still in flight when it lies.
	ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate 2gbit burst 512kb latency 50ms ||
		setup_fail "tc tbf is needed to keep the rogue's transfers in flight"
	hold decode0 "$NS_D" sink 4194304 31
	SINK=$HOLD_PID
	stats_json prefill0 >"$KVP_TMP/p0.json"
	local ok0 slots
	ok0=$(json_get "$KVP_TMP/p0.json" "d['completions']['ok']")
	slots=$(json_get "$KVP_TMP/p0.json" "d['totals']['inflight_max']")
	spawn "$NS_P" "$KVP_TMP/pin.out" - "$ROGUE_CLIENT" pin -s "$(sock_of prefill0)" --peer decode0 \
		--dst-key "file:$KVP_TMP/sink.key" --count "$slots" --seg 4194304 --hold 120
	PIN=$SPAWNED
	wait_file "$KVP_TMP/pin.out" 30 "$PIN"
	cat "$KVP_TMP/pin.out" >&2
	# Its transfers all end (acknowledged by decode0)...
	wait_json prefill0 stats "d['completions']['ok'] >= $ok0 + $slots" 120 \
		"the rogue's $slots transfers acknowledged"
	stats_json prefill0 >"$KVP_TMP/p1.json"
	log "after the rogue's transfers ended: $(json_get "$KVP_TMP/p1.json" "d['totals']['inflight']") of $slots transfer slots in use"
	# ...and an honest pair on the same node must still get transfer slots.
	ip netns exec "$NS_P" tc qdisc del dev "$VETH_P" root
	honest_pair pinned 8388608 9
	local rc=0
	wait_pid "$HPRE" 120 || rc=$?
	cat "$KVP_TMP/pinned.prefill.out" >&2
	if [[ $rc -ne 0 ]]; then
		stats_json prefill0 >"$KVP_TMP/p2.json"
		fail "a client that moved its CQ consumer index back keeps $(json_get "$KVP_TMP/p2.json" "d['totals']['inflight']") of $slots transfer slots after its transfers ended; an honest client on the same node failed (exit $rc): slots are pinned by completions the daemon cannot post"
	fi
	wait_pid "$HDEC" 60 || fail "honest decode client did not verify"
	stop_pid "$PIN" 10 || true
	untrack "$PIN"
	release_sink() { touch "$KVP_TMP/sink.stop"; wait_pid "$SINK" 30 || true; }
	release_sink
	reclaimed prefill0
	daemon_alive decode0 || fail "decode0 died"
	stop_daemon_checked prefill0
	stop_daemon_checked decode0
}

# truncate_round TAG: a client tries to make a registered region shrink
# under the daemon: an unsealed memfd is refused at registration, a sealed
# one cannot shrink; the daemons serve on.
truncate_round() {
	local tag=$1
	for n in decode0 prefill0; do
		in_ns "$([[ $n == decode0 ]] && echo "$NS_D" || echo "$NS_P")" "$ROGUE_CLIENT" hold \
			-s "$(sock_of $n)" --key-file "$KVP_TMP/$tag.$n.trunc.key" --size 16777216 \
			--seed 41 --stop-file "$KVP_TMP/$tag.trunc.stop" --truncate >"$KVP_TMP/$tag.trunc.out" 2>&1 ||
			fail "$tag: $n: $(cat "$KVP_TMP/$tag.trunc.out")"
		cat "$KVP_TMP/$tag.trunc.out" >&2
		daemon_alive "$n" || fail "$tag: $n died"
	done
	honest_pair "$tag.after" 16777216 43
	honest_done "$tag.after" 16777216
}

case_truncate() {
	start_pair 73
	truncate_round zerocopy
	stop_daemon_checked prefill0
	stop_daemon_checked decode0
	# The same through the staging pools (copies in user space).
	KVP_TEST=${KVP_TEST}_staged
	start_pair 74 'stage = { host = true; };'
	truncate_round staged
	stop_daemon_checked prefill0
	stop_daemon_checked decode0
}

case $CASE in
main) case_main ;;
cq-pin) case_cq_pin ;;
truncate) case_truncate ;;
*) setup_fail "unknown case '$CASE'" ;;
esac
