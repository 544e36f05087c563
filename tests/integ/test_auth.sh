#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts peer authentication: with different shared secrets the handshake
# is refused on both sides and counted, transfers fail fast with a peer
# error, the daemons keep serving their admin sockets; with the right secret
# the same nodes connect and move verified data.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

require_netns
require_bins
init_test
netns_pair 41
write_conf prefill0 "$ADDR_P:7400" decode0 "$ADDR_D:7400" 'auth = { secret = "right-secret"; };'
write_conf decode0 "$ADDR_D:7400" prefill0 "$ADDR_P:7400" 'auth = { secret = "wrong-secret"; };'
start_daemon prefill0 "$NS_P"
start_daemon decode0 "$NS_D"
wait_admin prefill0
wait_admin decode0

wait_json decode0 stats "d['totals']['auth_failures'] > 0" 30 "decode0 counts refused handshakes"
wait_json prefill0 stats "d['totals']['auth_failures'] > 0" 30 "prefill0 counts refused handshakes"
wait_json prefill0 peers "'authentication' in d['peers'][0]['last_error']" 30 \
	"prefill0 says why decode0 is down"
ctl prefill0 --json peers >"$KVP_TMP/peers.json"
json_check "$KVP_TMP/peers.json" "d['peers'][0]['state'] != 'up'" "a peer with the wrong secret must not be up"

# A transfer to the refused peer fails fast with a peer error; nothing hangs.
spawn "$NS_D" "$KVP_TMP/decode.bad.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
	--size 1048576 --seed 1 --key-file "$KVP_TMP/key.bad" --timeout 60
DEC=$SPAWNED
rc=0
in_ns "$NS_P" timeout 60 "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KVP_TMP/key.bad" --size 1048576 --seed 1 --wait-key 30 --json \
	>"$KVP_TMP/prefill.bad.json" || rc=$?
[[ $rc -eq 1 ]] || fail "prefill to a refused peer: exit $rc, expected 1"
json_check "$KVP_TMP/prefill.bad.json" "d['status']['peer'] == d['xfers']" "transfers must fail with a peer error"
stop_pid "$DEC" 5 || true
untrack "$DEC"

# Same nodes, matching secret: they connect and move verified data.
stop_daemon_checked decode0
write_conf decode0 "$ADDR_D:7400" prefill0 "$ADDR_P:7400" 'auth = { secret = "right-secret"; };'
start_daemon decode0 "$NS_D"
wait_admin decode0
wait_peer_up prefill0 decode0 30
wait_peer_up decode0 prefill0 30
spawn "$NS_D" "$KVP_TMP/decode.ok.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
	--size 16777216 --seed 2 --key-file "$KVP_TMP/key.ok" --timeout 60
DEC=$SPAWNED
in_ns "$NS_P" "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KVP_TMP/key.ok" --size 16777216 --seed 2 --wait-key 30 ||
	fail "transfer between authenticated peers failed"
wait_pid "$DEC" 60 || fail "decode client did not verify the data"
stop_daemon_checked prefill0
stop_daemon_checked decode0
