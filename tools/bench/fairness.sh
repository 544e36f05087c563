#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark, not a test: how kvproxyd shares itself among clients that
# overload it, at the default configuration, between two daemons on a veth
# pair. Two scenarios, each run with this build's daemons and, with --ref,
# with another build's daemons (same kvp-fair-bench clients) in the same run:
#
#   equal  six clients ask for 1536 transfers of 4 MiB at once (256 each):
#          the share of the completions each got while all six still had
#          work waiting, as a fraction of an equal share (1.0 = equal)
#   light  a heavy client keeps 512 transfers of 4 MiB queued (1200 in all,
#          twice limits.max_inflight);
#          a light client beside it sends 200 transfers of 64 KiB one at a
#          time, 2 ms apart: how many of the light client's end no-buffers,
#          at the default timeouts.admission_ms and at 100 ms
#
#   tools/bench/fairness.sh [BUILD_DIR] [--ref OTHER_BUILD_DIR] [--json FILE]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$ROOT/build
REF=""
JSON_OUT=""
while [[ $# -gt 0 ]]; do
	case $1 in
	--ref) REF=$(cd "$2" && pwd); shift 2 ;;
	--json) JSON_OUT=$2; shift 2 ;;
	-h | --help) sed -n 3,16p "$0"; exit 0 ;;
	*) BUILD=$(cd "$1" && pwd); shift ;;
	esac
done
export KVPROXYCTL=$BUILD/tools/kvproxyctl/kvproxyctl
FAIR=$BUILD/tools/bench/kvp-fair-bench
LAT=$BUILD/tools/bench/kvp-latency-bench

# shellcheck source=../../tests/integ/lib.sh
source "$ROOT/tests/integ/lib.sh"
KVP_TEST=bench_fairness
require_netns
[[ -x $FAIR && -x $LAT ]] || setup_fail "kvp-fair-bench / kvp-latency-bench are not built in $BUILD"
init_test
export KVP_EAL_DECODE=${KVP_EAL_DECODE---main-lcore 1}

# run NAME DAEMON_BUILD MODE ADMISSION_MS: one scenario, its JSON in $KVP_TMP/NAME.json
run() {
	local name=$1 dbuild=$2 mode=$3 adm=$4 args sink fair
	export KVPROXYD=$dbuild/app/kvproxyd
	KVP_TIMEOUTS_EXTRA=""
	[[ $adm == default ]] || KVP_TIMEOUTS_EXTRA="admission_ms = $adm;"
	write_conf prefill0 "$ADDR_P:7400" decode0 "$ADDR_D:7400"
	write_conf decode0 "$ADDR_D:7400" prefill0 "$ADDR_P:7400"
	up_pair "$NS_P" "$NS_D"
	rm -f "$KVP_TMP/key" "$KVP_TMP/stop" "$KVP_TMP/linger"
	spawn "$NS_D" "$KVP_TMP/sink.out" - "$LAT" sink -s "$(sock_of decode0)" \
		--size 4m --key-file "$KVP_TMP/key" --stop-file "$KVP_TMP/stop"
	sink=$SPAWNED
	wait_file "$KVP_TMP/key" 30 "$sink"
	if [[ $mode == equal ]]; then
		args=(--clients 6 --seg 4m --count 256 --queue 256)
	else
		args=(--clients 1 --seg 4m --count 1200 --queue 512 --light-count 200 --light-seg 64k
			--light-gap-ms 2)
	fi
	spawn "$NS_P" "$KVP_TMP/$name.json" "$KVP_TMP/$name.err" "$FAIR" -s "$(sock_of prefill0)" \
		--peer decode0 --key-file "$KVP_TMP/key" --linger-file "$KVP_TMP/linger" \
		--run-timeout 300 "${args[@]}"
	fair=$SPAWNED
	wait_file "$KVP_TMP/$name.json" 330 "$fair"
	touch "$KVP_TMP/linger" "$KVP_TMP/stop"
	wait_pid "$fair" 30 || fail "$name: kvp-fair-bench failed: $(cat "$KVP_TMP/$name.err")"
	wait_pid "$sink" 30 || fail "$name: sink failed"
	stop_daemon_checked prefill0
	stop_daemon_checked decode0
	log "$name: $(cat "$KVP_TMP/$name.json")"
}

netns_pair 61
names=()
for b in new ${REF:+ref}; do
	dir=$BUILD
	[[ $b == ref ]] && dir=$REF
	run "$b.equal" "$dir" equal default
	run "$b.light" "$dir" light default
	run "$b.light100" "$dir" light 100
	names+=("$b")
done

python3 - "$KVP_TMP" "$JSON_OUT" "${names[@]}" <<'PY'
import json, sys
tmp, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
res = {}
print("\n%-5s %-28s %s" % ("build", "scenario", "result"))
for n in names:
    e = json.load(open("%s/%s.equal.json" % (tmp, n)))
    shares = [c["share"] for c in e["clients"]]
    ok = sum(c["status"].get("ok", 0) for c in e["clients"])
    print("%-5s %-28s min share %.2f, shares %s, %d of 1536 ok" %
          (n, "six equal clients", e["min_share"], " ".join("%.2f" % s for s in shares), ok))
    res[n] = {"equal": e}
    for key, label in (("light", "light client, admission default"), ("light100", "light client, admission 100 ms")):
        l = json.load(open("%s/%s.%s.json" % (tmp, n, key)))
        lt = l["light"]
        print("%-5s %-28s no-buffers %d of 200, p50 %.0f us, max %.0f us; heavy %s" %
              (n, label, lt["status"].get("no-buffers", 0), lt["p50_us"], lt["max_us"],
               l["clients"][0]["status"]))
        res[n][key] = l
if out:
    json.dump(res, open(out, "w"), indent=1)
PY
