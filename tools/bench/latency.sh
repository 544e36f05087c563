#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark, not a test: latency of one kvproxy transfer at a time against a
# plain TCP ping-pong of the same size between two processes over the same
# path (the floor any TCP transport pays), measured in one run.
#
#   tools/bench/latency.sh [BUILD_DIR] [--sizes 4k,64k,1m] [--iters N] [--reps R]
#                          [--veth] [--conf 'EXTRA CONFIG'] [--json FILE] [--png FILE]
#
# Two kvproxyd (default configuration; their worker lcores on different
# CPUs, as on two hosts) on loopback in one private network namespace, or
# with --veth in two namespaces joined by a veth pair. For each size, R
# interleaved rounds of N transfers each of three series:
#   ping-pong        kvp-latency-bench ping/pong, blocking, where the
#                    scheduler puts them (on this 2-CPU VM: both on one CPU,
#                    where a wake-up costs ~2 us instead of ~20 across CPUs)
#   ping-pong/cpus   the same, its ends on the two workers' CPUs and polling
#                    their sockets as the workers do (--spin): the path a
#                    transfer's bytes take between the two workers (left
#                    out where the workers poll their CPUs, poll.busy)
#   kvproxy          kvp-latency-bench run: one transfer (one segment) at a
#                    time, clients where the scheduler puts them, to a sink
#                    client on the other node
# Prints p50/p99/p99.9 of every series (all rounds pooled), kvproxy's ratios
# to both references, and the median of each phase stamp kvproxy recorded
# (where the time went: queue = client to worker, first/post = handing the
# bytes to the kernel, wire = until the receiver's ACK is in, client_wake =
# completion posted to the client having it). --png draws the latency
# distributions (needs python3-matplotlib).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$ROOT/build
SIZES=(4096 65536 1048576)
ITERS=2000
REPS=3
VETH=0
EXTRA_CONF=""
JSON_OUT=""
PNG_OUT=""
while [[ $# -gt 0 ]]; do
	case $1 in
	--sizes) IFS=, read -r -a SIZES <<<"$2"; shift 2 ;;
	--iters) ITERS=$2; shift 2 ;;
	--reps) REPS=$2; shift 2 ;;
	--veth) VETH=1; shift ;;
	--conf) EXTRA_CONF=$2; shift 2 ;;
	--json) JSON_OUT=$2; shift 2 ;;
	--png) PNG_OUT=$2; shift 2 ;;
	-h | --help) sed -n 3,18p "$0"; exit 0 ;;
	*) BUILD=$(cd "$1" && pwd); shift ;;
	esac
done
export KVPROXYD=$BUILD/app/kvproxyd KVPROXYCTL=$BUILD/tools/kvproxyctl/kvproxyctl
export KVPROXY_BENCH=$BUILD/tools/bench/kvproxy-bench
LAT=$BUILD/tools/bench/kvp-latency-bench

# shellcheck source=../../tests/integ/lib.sh
source "$ROOT/tests/integ/lib.sh"
KVP_TEST=bench_latency
# --sizes takes 4k, 64K, 1m as well as bytes.
for i in "${!SIZES[@]}"; do
	b=$(numfmt --from=iec "${SIZES[i]^^}" 2>/dev/null) || setup_fail "--sizes: bad size '${SIZES[i]}'"
	SIZES[i]=$b
done
require_netns
require_bins
[[ -x $LAT ]] || setup_fail "$LAT is not built"
init_test
# Both daemons get EAL lcores 0,1: the decode daemon's main lcore goes to
# CPU 1 so that the two workers run on different CPUs (override with
# KVP_EAL_DECODE; empty: both workers on CPU 1, as two sidecars on one host
# get by default, the faster placement on this 2-CPU VM, where a 64 KiB
# copy across CPUs costs more than the turns on one).
export KVP_EAL_DECODE=${KVP_EAL_DECODE---main-lcore 1}
if ((VETH)); then
	start_pair 93 "$EXTRA_CONF"
	PRE_ADDR=$ADDR_P DEC_ADDR=$ADDR_D
	path="veth between two namespaces"
else
	NS_P="kvp-bench-lat-$$"
	ip netns add "$NS_P" || setup_fail "ip netns add"
	KVP_NETNS+=("$NS_P")
	ip -n "$NS_P" link set lo up
	NS_D=$NS_P PRE_ADDR=127.0.0.1 DEC_ADDR=127.0.0.1
	write_conf prefill0 "127.0.0.1:7400" decode0 "127.0.0.1:7401" "$EXTRA_CONF"
	write_conf decode0 "127.0.0.1:7401" prefill0 "127.0.0.1:7400" "$EXTRA_CONF"
	up_pair "$NS_P" "$NS_D"
	path="loopback in one network namespace"
fi
log "path: $path; $REPS rounds of $ITERS per size and series"
# The workers' CPUs (EAL lcore ids are CPU ids with -l): the pinned ping-pong's ends.
CPU_P=$(worker_lcores prefill0)
CPU_P=${CPU_P%%,*}
CPU_D=$(worker_lcores decode0)
CPU_D=${CPU_D%%,*}
log "worker CPUs: prefill0 $CPU_P, decode0 $CPU_D"
# Workers that never sleep (poll.busy, or cores = "auto" choosing it) own
# their CPUs: a spinning ping-pong pinned there would only fight them for
# time slices (4-8 ms turns), so that series is left out.
BUSY=$(ctl prefill0 --json config_get poll.busy | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["value"]))')
((BUSY == 0)) || log "poll.busy: the workers poll their CPUs; no ping-pong/cpus series"

spawn "$NS_D" "$KVP_TMP/pong.log" - "$LAT" pong --addr "$DEC_ADDR:5301" --size 1
PONG1=$SPAWNED

for size in "${SIZES[@]}"; do
	# The sink and the pong server for this size, on the decode side.
	spawn "$NS_D" "$KVP_TMP/sink.$size.log" - "$LAT" sink -s "$(sock_of decode0)" --size "$size" \
		--key-file "$KVP_TMP/key.$size" --stop-file "$KVP_TMP/stop.$size"
	SINK=$SPAWNED
	port=$((5400 + size % 997))
	spawn "$NS_D" "$KVP_TMP/pong.$size.log" - "$LAT" pong --addr "$DEC_ADDR:$port" --size "$size"
	PONG=$SPAWNED
	PONGC=
	if ((BUSY == 0)); then
		spawn "$NS_D" "$KVP_TMP/pongc.$size.log" - taskset -c "$CPU_D" "$LAT" pong \
			--addr "$DEC_ADDR:$((port + 1))" --size "$size" --spin
		PONGC=$SPAWNED
	fi
	for ((r = 0; r < REPS; r++)); do
		in_ns "$NS_P" "$LAT" ping --addr "$DEC_ADDR:$port" --size "$size" \
			--iters "$ITERS" --warmup 200 --samples "$KVP_TMP/pp.$size.$r" --json \
			>"$KVP_TMP/pp.$size.$r.json" || fail "ping-pong $size failed"
		((BUSY)) ||
			in_ns "$NS_P" taskset -c "$CPU_P" "$LAT" ping --addr "$DEC_ADDR:$((port + 1))" \
				--size "$size" --iters "$ITERS" --warmup 200 --spin \
				--samples "$KVP_TMP/ppc.$size.$r" --json >"$KVP_TMP/ppc.$size.$r.json" ||
			fail "ping-pong/cpus $size failed"
		in_ns "$NS_P" "$LAT" run -s "$(sock_of prefill0)" --peer decode0 \
			--key-file "$KVP_TMP/key.$size" --size "$size" --iters "$ITERS" --warmup 200 \
			--samples "$KVP_TMP/kvp.$size.$r" --json >"$KVP_TMP/kvp.$size.$r.json" ||
			fail "kvproxy run $size failed"
		log "size $size round $r (p50 us): ping-pong $(json_get "$KVP_TMP/pp.$size.$r.json" 'd["latency"]["p50_us"]')," \
			"ping-pong/cpus $( ((BUSY)) && echo - || json_get "$KVP_TMP/ppc.$size.$r.json" 'd["latency"]["p50_us"]')," \
			"kvproxy $(json_get "$KVP_TMP/kvp.$size.$r.json" 'd["latency"]["p50_us"]')"
	done
	touch "$KVP_TMP/stop.$size"
	wait_pid "$SINK" 30 || fail "sink client ($size) failed"
	for p in "$PONG" $PONGC; do
		stop_pid "$p" 5 >/dev/null 2>&1 || true
		untrack "$p"
	done
done
stop_pid "$PONG1" 5 >/dev/null 2>&1 || true
untrack "$PONG1"
stats_json prefill0 >"$KVP_TMP/prefill.stats"

python3 - "$KVP_TMP" "$REPS" "$JSON_OUT" "$PNG_OUT" "$path" "$BUSY" "${SIZES[@]}" <<'PY'
import json, sys
tmp, reps, out, png, path, busy, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6] == "1", sys.argv[7:]
KINDS = (("pp", "pingpong"),) + ((("ppc", "pingpong_cpus"),) if not busy else ()) + (("kvp", "kvproxy"),)
def samples(kind, size):
    v = []
    for r in range(reps):
        v += [int(l) for l in open("%s/%s.%s.%d" % (tmp, kind, size, r))]
    return sorted(v)
def q(v, p):
    import math
    return v[max(0, min(len(v), math.ceil(len(v) * p)) - 1)] / 1e3
def med(key, size):
    vals = sorted(json.load(open("%s/kvp.%s.%d.json" % (tmp, size, r)))["phases"][key]["p50_us"] for r in range(reps))
    return vals[len(vals) // 2]
res = {"path": path, "sizes": []}
print("\n%s; %d rounds pooled; microseconds" % (path, reps))
print("%-8s %-15s %8s %8s %8s   %s" % ("size", "series", "p50", "p99", "p99.9", "kvproxy / reference"))
stats = json.load(open("%s/prefill.stats" % tmp))
QS = (("p50", .5), ("p99", .99), ("p999", .999))
for s in sizes:
    row = {"size": int(s)}
    for kind, name in KINDS:
        v = samples(kind, s)
        row[name] = {k: q(v, p) for k, p in QS}
    row["ratio"] = {k: row["kvproxy"][k] / row["pingpong"][k] for k, _ in QS}
    if not busy:
        row["ratio_cpus"] = {k: row["kvproxy"][k] / row["pingpong_cpus"][k] for k, _ in QS}
    row["phases_p50_us"] = {k: med(k, s) for k in ("queue", "admit", "first", "post", "wire", "deliver", "e2e", "client_wake")}
    res["sizes"].append(row)
    print("%-8s %-15s %8.1f %8.1f %8.1f" % (s, "ping-pong", *row["pingpong"].values()))
    if not busy:
        print("%-8s %-15s %8.1f %8.1f %8.1f" % (s, "ping-pong/cpus", *row["pingpong_cpus"].values()))
    print("%-8s %-15s %8.1f %8.1f %8.1f   p50 %.2fx p99 %.2fx p99.9 %.2fx" %
          (s, "kvproxy", *row["kvproxy"].values(), *row["ratio"].values()) +
          ("" if busy else " (/cpus: %.2fx %.2fx %.2fx)" % tuple(row["ratio_cpus"].values())))
    print("%-8s %-15s %s" % ("", "phases (p50)", "  ".join("%s %.1f" % kv for kv in row["phases_p50_us"].items())))
print("prefill0 worker sleeps: %s" % [w["sleeps"] for w in stats["workers"]])
if out:
    json.dump(res, open(out, "w"), indent=1)
if png:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no PNG (apt-get install python3-matplotlib)")
        sys.exit(0)
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4))
    for ax, s in zip(axes if len(sizes) > 1 else [axes], sizes):
        labels = {"pp": "TCP ping-pong", "ppc": "TCP ping-pong, workers' CPUs, polling", "kvp": "kvproxy"}
        for kind, _ in KINDS:
            label = labels[kind]
            v = [x / 1e3 for x in samples(kind, s)]
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=label)
        ax.set_xscale("log")
        ax.set_xlabel("latency (us)")
        ax.set_ylabel("fraction of transfers")
        ax.set_title("%s bytes, one at a time" % s)
        ax.grid(True, which="both", alpha=.3)
        ax.legend()
    fig.suptitle(path)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print("wrote %s" % png)
PY
stop_daemon_checked prefill0
stop_daemon_checked decode0
