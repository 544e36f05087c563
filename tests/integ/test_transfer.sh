#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts: 256 MiB in mixed 4 KiB..8 MiB segments moves prefill0 -> decode0
# across two network namespaces, every byte verified, and both nodes' stats
# agree (bytes per peer, one ok completion per transfer, no failures); then
# kvproxy-bench --rounds 3 (16 MiB sent three times, verified). With
# several workers (KVP_WORKERS) the decode client sits on worker 1 while the
# bytes land through worker 0's links: every landing notice crosses.
# Argument "zerocopy": the same with tcp.zerocopy (SENDMSG_ZC: frames are
# released only at the kernel's notifications, several sends outstanding).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

SIZE=268435456
SEED=${KVP_SEED:-$RANDOM}

require_netns
require_bins
zerocopy_variant "${1:-}"
init_test
start_pair 11 "$CONF"
if [[ -n $CONF ]]; then
	ctl prefill0 --json config_get tcp.zerocopy >"$KVP_TMP/zc.json"
	json_check "$KVP_TMP/zc.json" "d['value'] is True" "prefill0 does not run with tcp.zerocopy"
fi

occupy_worker0 decode0 "$NS_D"
KEY="$KVP_TMP/decode.key"
log "decode client: $SIZE bytes, seed $SEED"
spawn "$NS_D" "$KVP_TMP/decode.out" "$KVP_TMP/decode.err" "$KVPROXY_BENCH" decode \
	-s "$(sock_of decode0)" --size "$SIZE" --seed "$SEED" --key-file "$KEY" --timeout 400 --json
DEC=$SPAWNED

log "prefill client"
prc=0
in_ns "$NS_P" timeout -k 5 420 "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KEY" --size "$SIZE" --seed "$SEED" --min-seg 4096 --max-seg 8388608 \
	--wait-key 60 --json >"$KVP_TMP/prefill.out" 2>"$KVP_TMP/prefill.err" || prc=$?
cat "$KVP_TMP/prefill.err" >&2
[[ $prc -eq 0 ]] || fail "prefill client exited with $prc: $(cat "$KVP_TMP/prefill.out")"

drc=0
wait_pid "$DEC" 120 || drc=$?
cat "$KVP_TMP/decode.err" >&2
[[ $drc -eq 0 ]] || fail "decode client exited with $drc: $(cat "$KVP_TMP/decode.out")"

XFERS=$(json_get "$KVP_TMP/prefill.out" 'd["xfers"]')
json_check "$KVP_TMP/prefill.out" "d['bytes'] == $SIZE and d['status']['ok'] == d['xfers']" \
	"prefill client did not report every transfer ok"
json_check "$KVP_TMP/decode.out" "d['bytes'] == $SIZE and d['mismatches'] == 0 and d['xfers'] == $XFERS" \
	"decode client did not verify $SIZE bytes in $XFERS transfers"
log "clients: $XFERS transfers, $SIZE bytes verified"

stats_json prefill0 >"$KVP_TMP/p.stats"
stats_json decode0 >"$KVP_TMP/d.stats"
FAILS='sum(v for k, v in d["completions"].items() if k != "ok")'
json_check "$KVP_TMP/p.stats" "peer('decode0')['tx_bytes'] >= $SIZE" "prefill0: peer decode0 tx_bytes < $SIZE"
json_check "$KVP_TMP/d.stats" "peer('prefill0')['rx_bytes'] >= $SIZE" "decode0: peer prefill0 rx_bytes < $SIZE"
json_check "$KVP_TMP/p.stats" "d['completions']['ok'] == $XFERS" \
	"prefill0: completions.ok != $XFERS transfers the client reported"
json_check "$KVP_TMP/p.stats" "$FAILS == 0" "prefill0: failed completions"
json_check "$KVP_TMP/d.stats" "$FAILS == 0" "decode0: failed completions"
json_check "$KVP_TMP/p.stats" "d['totals']['xfers_submitted'] == $XFERS and d['totals']['xfers_done'] == $XFERS" \
	"prefill0: totals.xfers_submitted/xfers_done != $XFERS"
json_check "$KVP_TMP/d.stats" "d['totals']['xfers_landed'] == $XFERS" "decode0: totals.xfers_landed != $XFERS"
json_check "$KVP_TMP/p.stats" "peer('decode0')['bad_frames'] == 0" "prefill0: bad frames from decode0"
if [[ -n $CONF ]]; then
	# Gathers under 16 KiB (ACKs, a lone small segment) go by plain sendmsg,
	# so a seed with many small transfers sends a few MiB by copy: at least
	# seven eighths of the payload must have gone zero-copy.
	ZC=$(json_get "$KVP_TMP/p.stats" "peer('decode0')['tcp_zerocopy_bytes']")
	log "zero-copy sends: $ZC bytes of $SIZE payload"
	json_check "$KVP_TMP/p.stats" "peer('decode0')['tcp_zerocopy_bytes'] >= $SIZE * 7 // 8" \
		"prefill0: the payload did not go by zero-copy sends (tcp_zerocopy_bytes < 7/8 of $SIZE)"
	# Local delivery (veth) makes the kernel copy anyway (Linux 6.2+ says so):
	# what it reports copied is part of what went zero-copy, and the log
	# says it once most of 64 MiB or more was (never below 64 MiB).
	COPIED=$(json_get "$KVP_TMP/p.stats" "peer('decode0')['tcp_zerocopy_copied_bytes']")
	log "of which the kernel copied: $COPIED bytes"
	json_check "$KVP_TMP/p.stats" \
		"0 <= peer('decode0')['tcp_zerocopy_copied_bytes'] <= peer('decode0')['tcp_zerocopy_bytes']" \
		"prefill0: more bytes copied than sent zero-copy"
	if [[ $KVP_WORKERS -eq 1 && $COPIED -ge $((64 << 20)) && $((COPIED * 2)) -ge $ZC ]]; then
		grep -q "the kernel copied zero-copy sends to peer" "$KVP_TMP/prefill0.log" ||
			fail "prefill0 counted $COPIED of $ZC bytes copied but did not say so in its log"
	elif [[ $COPIED -lt $((64 << 20)) ]] && grep -q "the kernel copied zero-copy sends" "$KVP_TMP/prefill0.log"; then
		fail "prefill0 said the kernel copied zero-copy sends with only $COPIED bytes counted"
	fi
	# doctor warns when most of it was copied (then zero-copy only costs).
	ctl prefill0 --json doctor >"$KVP_TMP/doctor.json"
	json_check "$KVP_TMP/doctor.json" \
		"[c['result'] for c in d['checks'] if c['check'] == 'tcp.zerocopy'] == [('warning' if $COPIED * 2 >= $ZC else 'ok')]" \
		"prefill0: doctor's tcp.zerocopy check does not match the stats ($COPIED of $ZC copied)"
else
	json_check "$KVP_TMP/p.stats" \
		"peer('decode0')['tcp_zerocopy_bytes'] == 0 and peer('decode0')['tcp_zerocopy_copied_bytes'] == 0" \
		"prefill0: zero-copy sends without tcp.zerocopy"
fi
json_check "$KVP_TMP/d.stats" "peer('prefill0')['bad_frames'] == 0" "decode0: bad frames from prefill0"
log "stats agree: tx/rx >= $SIZE, $XFERS ok completions, no failures"
if [[ $KVP_WORKERS -gt 1 ]]; then
	json_check "$KVP_TMP/d.stats" "d['workers'][0]['landings_forwarded'] == $XFERS" \
		"decode0: worker 0 should have handed every landing notice to worker 1"
	release_worker0 decode0
fi

# --rounds: the plan (several transfers) three times over the same regions
# (each transfer lands three times, verified once at the end); bad round
# counts are refused.
RSIZE=16777216
spawn "$NS_D" "$KVP_TMP/rounds.decode.out" "$KVP_TMP/rounds.decode.err" "$KVPROXY_BENCH" decode \
	-s "$(sock_of decode0)" --size "$RSIZE" --seed "$SEED" --key-file "$KVP_TMP/rounds.key" \
	--max-seg 1m --segs-per-xfer 2 --rounds 3 --timeout 120 --json
DEC=$SPAWNED
in_ns "$NS_P" timeout -k 5 120 "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KVP_TMP/rounds.key" --size "$RSIZE" --seed "$SEED" --max-seg 1m --segs-per-xfer 2 \
	--rounds 3 --wait-key 60 \
	--json >"$KVP_TMP/rounds.prefill.out" || fail "prefill --rounds 3 failed"
wait_pid "$DEC" 60 || fail "decode --rounds 3 failed: $(cat "$KVP_TMP/rounds.decode.err")"
RX=$(json_get "$KVP_TMP/rounds.prefill.out" 'd["xfers"]')
json_check "$KVP_TMP/rounds.prefill.out" "d['bytes'] == 3 * $RSIZE and d['rounds'] == 3 and d['xfers'] % 3 == 0 and d['xfers'] >= 6 and d['status']['ok'] == d['xfers']" \
	"prefill --rounds 3 did not send the plan three times"
json_check "$KVP_TMP/rounds.decode.out" "d['bytes'] == 3 * $RSIZE and d['xfers'] == $RX and d['mismatches'] == 0" \
	"decode --rounds 3 did not verify three rounds of $RSIZE bytes"
for bad in "--rounds 0 --size 4096" "--rounds 2 --size 0x8000000000000000"; do
	rc=0
	# shellcheck disable=SC2086 # the flags are split on purpose
	"$KVPROXY_BENCH" decode -s /nonexistent --key-file "$KVP_TMP/none" $bad 2>"$KVP_TMP/rounds.bad" || rc=$?
	[[ $rc -eq 2 ]] || fail "kvproxy-bench decode $bad exited $rc, want 2 (usage error)"
	grep -q -- --rounds "$KVP_TMP/rounds.bad" || fail "kvproxy-bench decode $bad: no word of --rounds"
done
log "--rounds 3: $RX transfers, 3 x $RSIZE bytes verified; --rounds 0 and an overflow refused"

# Both clients are gone: their channels and regions must be reclaimed.
for n in prefill0 decode0; do
	wait_json "$n" status 'd["clients"] == 0 and d["regions"] == 0 and d["inflight"] == 0' 30 \
		"clients, regions and inflight back to 0 after the clients exited"
done

# The text renderings work against the real daemon too.
ctl prefill0 stats >"$KVP_TMP/p.stats.txt" || fail "kvproxyctl stats (text) failed"
grep -q decode0 "$KVP_TMP/p.stats.txt" || fail "kvproxyctl stats text does not mention peer decode0"
ctl prefill0 peers | grep -Eq '^decode0 .* up( |$)' || fail "kvproxyctl peers text does not show decode0 up"
ctl prefill0 stats --prometheus >"$KVP_TMP/p.prom" || fail "kvproxyctl stats --prometheus failed"
python3 - "$KVP_TMP/p.prom" <<'EOF' || fail "stats --prometheus is not valid text exposition"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^{}]*\})? ([-+]?[0-9.eE+-]+|NaN|[+-]Inf)( -?[0-9]+)?$')
samples = [l for l in lines if l and not l.startswith("#")]
bad = [l for l in samples if not sample.match(l)]
if not samples or bad:
    print("no samples" if not samples else "bad lines: %r" % bad[:5], file=sys.stderr)
    sys.exit(1)
EOF

stop_daemon_checked prefill0
stop_daemon_checked decode0
