#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts that transfers over an impaired link still complete with every
# byte verified: random packet loss (nftables numgen drop on the decode
# node's input; this kernel has no netem) and a rate limit (tc tbf). The
# nodes authenticate each other with a shared secret throughout. Argument
# "zerocopy": with tcp.zerocopy and host memory staged, where retransmitted
# and rate-limited segments still point at staging buffers and frame
# headers after the sends returned: reusing those before the kernel's
# notification would put wrong bytes on the wire.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

require_netns
require_bins
command -v nft >/dev/null || skip "nft (nftables) is not installed"
zerocopy_variant "${1:-}" "stage = { host = true; };"
init_test
KVP_PEER_MS=5000 # loss makes TCP back off; that is slowness, not death
start_pair 31 "auth = { secret = \"impaired-link-secret\"; }; $CONF"

# verified_transfer SIZE SEED: decode + prefill, both must succeed.
verified_transfer() {
	spawn "$NS_D" "$KVP_TMP/decode.$2.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
		--size "$1" --seed "$2" --key-file "$KVP_TMP/key.$2" --timeout 300
	local dec=$SPAWNED
	in_ns "$NS_P" "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
		--key-file "$KVP_TMP/key.$2" --size "$1" --seed "$2" --wait-key 60 --timeout-ms 240000 ||
		fail "prefill over the impaired link failed (seed $2)"
	wait_pid "$dec" 120 || fail "decode client did not verify the data (seed $2): $(cat "$KVP_TMP/decode.$2.out")"
}

# 1. Loss: drop 1 in 100 packets arriving at decode0's port.
ip netns exec "$NS_D" nft -f - <<NFT || setup_fail "cannot install the nftables loss rule"
table inet kvploss {
	chain input {
		type filter hook input priority 0; policy accept;
		tcp dport 7400 numgen random mod 1000 < 10 counter drop
	}
}
NFT
verified_transfer 134217728 41
drops=$(ip netns exec "$NS_D" nft list table inet kvploss | sed -n 's/.*counter packets \([0-9]*\).*/\1/p')
log "nftables dropped $drops packets"
[[ ${drops:-0} -gt 0 ]] || fail "the loss rule dropped nothing: the test did not test loss"
wait_json prefill0 stats "peer('decode0')['tcp_retransmits'] > 0" 10 \
	"prefill0 counts the kernel's retransmissions to decode0"
ip netns exec "$NS_D" nft delete table inet kvploss

# 2. Rate limit: 200 Mbit/s on prefill0's side.
ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate 200mbit burst 128kb latency 50ms ||
	setup_fail "tc tbf unavailable"
verified_transfer 33554432 42
ip netns exec "$NS_P" tc qdisc del dev "$VETH_P" root

stats_json prefill0 >"$KVP_TMP/p.stats"
json_check "$KVP_TMP/p.stats" "d['completions']['ok'] > 0 and sum(d['completions'].values()) == d['completions']['ok']" \
	"prefill0: every transfer must have completed ok"
json_check "$KVP_TMP/p.stats" "d['totals']['auth_failures'] == 0" "authenticated peers must not fail auth"
stop_daemon_checked prefill0
stop_daemon_checked decode0
