#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Demo: two kvproxyd ("prefill0" and "decode0") in two network namespaces
# joined by a veth pair; a decode client registers a destination region, a
# prefill client sends it DEMO_SIZE bytes (default 1 GiB) of random KV in
# mixed 4 KiB..8 MiB segments, the decode client verifies every byte; then
# both nodes' status, peers and stats. Cleans up only what it started.
#
# Usage (as root): ./tools/demo.sh
#   DEMO_SIZE=256m     move less (k/m/g suffixes)
#   DEMO_BUILDDIR=dir  build directory (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=${DEMO_SIZE:-1g}
SEED=${DEMO_SEED:-$RANDOM}
B=${DEMO_BUILDDIR:-build}

./tools/deps.sh
if [[ ! -f $B/build.ninja ]]; then
	meson setup "$B" </dev/null
fi
ninja -C "$B" </dev/null

# Binaries wherever meson put them.
target() {
	meson introspect "$B" --targets | python3 -c '
import json, sys
t = [t for t in json.load(sys.stdin) if t["name"] == sys.argv[1] and t["type"] == "executable"]
print(t[0]["filename"][0] if t else "")
' "$1"
}
KVPROXYD=$(target kvproxyd)
KVPROXYCTL=$(target kvproxyctl)
KVPROXY_BENCH=$(target kvproxy-bench)
export KVPROXYD KVPROXYCTL KVPROXY_BENCH

export KVP_OK_WORD="demo done"
# shellcheck source=tests/integ/lib.sh
. tests/integ/lib.sh
require_netns
require_bins
init_test
start_pair 200

section() { printf '\n===== %s =====\n' "$*"; }

KEY="$KVP_TMP/decode.key"
section "clients: $SIZE bytes prefill0 -> decode0 (seed $SEED)"
spawn "$NS_D" "$KVP_TMP/decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
	--size "$SIZE" --seed "$SEED" --key-file "$KEY" --timeout 600
DEC=$SPAWNED
rc=0
ip netns exec "$NS_P" "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KEY" --size "$SIZE" --seed "$SEED" --min-seg 4096 --max-seg 8m \
	--wait-key 60 || rc=$?
[[ $rc -eq 0 ]] || fail "prefill client exited $rc"
rc=0
wait_pid "$DEC" 600 || rc=$?
cat "$KVP_TMP/decode.out"
[[ $rc -eq 0 ]] || fail "decode client exited $rc"

for n in prefill0 decode0; do
	section "kvproxyctl status ($n)"
	ctl "$n" status
	section "kvproxyctl peers ($n)"
	ctl "$n" peers
	section "kvproxyctl stats ($n)"
	ctl "$n" stats
done
echo
