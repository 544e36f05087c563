#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts: two kvproxyd on one host (no namespaces, loopback, distinct ports
# and sockets, --no-shconf each) see each other up and move 32 MiB with every
# byte verified; both then stop cleanly.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

SIZE=$((32 * 1024 * 1024))
SEED=${KVP_SEED:-$RANDOM}

require_root "the integ suite runs kvproxyd as root"
require_bins
init_test

loopback_pair

# Each daemon reports its own identity through its own admin socket.
ctl prefill0 --json status >"$KVP_TMP/p.status"
ctl decode0 --json status >"$KVP_TMP/d.status"
json_check "$KVP_TMP/p.status" "d['node_id'] == 'prefill0' and d['pid'] == ${DPID[prefill0]}" \
	"prefill0's admin socket reports another node or pid"
json_check "$KVP_TMP/d.status" "d['node_id'] == 'decode0' and d['pid'] == ${DPID[decode0]}" \
	"decode0's admin socket reports another node or pid"

KEY="$KVP_TMP/decode.key"
spawn "" "$KVP_TMP/decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
	--size "$SIZE" --seed "$SEED" --key-file "$KEY" --timeout 200
DEC=$SPAWNED
rc=0
timeout -k 5 240 "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 --key-file "$KEY" \
	--size "$SIZE" --seed "$SEED" --wait-key 60 >"$KVP_TMP/prefill.out" 2>&1 || rc=$?
cat "$KVP_TMP/prefill.out" >&2
[[ $rc -eq 0 ]] || fail "prefill client exited $rc"
rc=0
wait_pid "$DEC" 120 || rc=$?
cat "$KVP_TMP/decode.out" >&2
[[ $rc -eq 0 ]] || fail "decode client exited $rc"
grep -q "decode: verified $SIZE bytes" "$KVP_TMP/decode.out" ||
	fail "decode client did not report $SIZE verified bytes"

stats_json decode0 >"$KVP_TMP/d.stats"
json_check "$KVP_TMP/d.stats" \
	"peer('prefill0')['rx_bytes'] >= $SIZE" \
	"decode0: peer prefill0 rx_bytes < $SIZE"

stop_daemon_checked prefill0
stop_daemon_checked decode0
