#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark, not a test: kvproxy over TCP between two network namespaces
# against iperf3 over the same veth, in one run, reported as ratios.
#
#   tools/bench/tcp_vs_iperf.sh [BUILD_DIR] [--size BYTES] [--reps N] [--json FILE]
#                               [--conf 'EXTRA CONFIG', e.g. 'tcp = { zerocopy = true; };']
#                               [--segs 65536,1048576,4194304] [--loopback] [--ucx]
#                               [--cc ALGORITHM] [--no-kv]
#
# --reps rounds, interleaved: iperf3 for 5 s (-l 1M) single-stream and with
# as many streams as kvproxy has connections to its peer (tcp.connections),
# with --ucx UCX's ucx_perftest tag_bw and ucp_am_bw over its TCP transport
# at each segment size (Debian: ucx-utils), then kvproxy-bench moving --size
# bytes per segment size and the KV pattern. --loopback: both daemons on
# 127.0.0.1 in one namespace instead of a veth pair. --cc: the TCP
# congestion control for everyone (kvproxy's tcp.congestion, iperf3 -C,
# UCX's sockets keep the namespace's default). Best and median of each
# series; kvproxy figures as ratios of both iperf3s; TCP retransmissions
# per series (nstat in the sending namespace).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$ROOT/build
SIZE=$((1024 * 1024 * 1024))
REPS=3
JSON_OUT=""
EXTRA_CONF=""
SEGS=(65536 1048576 4194304)
LOOPBACK=0
UCX=0
CC=""
NO_KV=0
while [[ $# -gt 0 ]]; do
	case $1 in
	--size) SIZE=$2; shift 2 ;;
	--reps) REPS=$2; shift 2 ;;
	--json) JSON_OUT=$2; shift 2 ;;
	--segs) IFS=, read -r -a SEGS <<<"$2"; shift 2 ;;
	--conf) EXTRA_CONF=$2; shift 2 ;;
	--loopback) LOOPBACK=1; shift ;;
	--ucx) UCX=1; shift ;;
	--cc) CC=$2; shift 2 ;;
	--no-kv) NO_KV=1; shift ;;
	-h | --help) sed -n 3,20p "$0"; exit 0 ;;
	*) BUILD=$(cd "$1" && pwd); shift ;;
	esac
done
export KVPROXYD=$BUILD/app/kvproxyd KVPROXYCTL=$BUILD/tools/kvproxyctl/kvproxyctl
export KVPROXY_BENCH=$BUILD/tools/bench/kvproxy-bench

# shellcheck source=../../tests/integ/lib.sh
source "$ROOT/tests/integ/lib.sh"
KVP_TEST=bench_tcp
require_netns
require_bins
command -v iperf3 >/dev/null || setup_fail "iperf3 is not installed (apt-get install iperf3)"
((UCX == 0)) || command -v ucx_perftest >/dev/null ||
	setup_fail "ucx_perftest is not installed (apt-get install ucx-utils)"
init_test
# Both daemons get EAL lcores 0,1; on one host their workers would share a
# CPU. The decode daemon's main lcore goes to CPU 1 so its worker runs on 0,
# as two hosts would have it (override with KVP_EAL_DECODE).
export KVP_EAL_DECODE=${KVP_EAL_DECODE---main-lcore 1}
log "lcores: prefill0 ${KVP_EAL[*]:0:2} (worker on CPU 1), decode0 the same with $KVP_EAL_DECODE (worker on CPU 0)"
[[ -z $CC ]] || EXTRA_CONF="$EXTRA_CONF tcp = { congestion = \"$CC\"; };"
if ((LOOPBACK)); then
	NS_P="kvp-bench-tcp-$$"
	ip netns add "$NS_P" || setup_fail "ip netns add"
	KVP_NETNS+=("$NS_P")
	ip -n "$NS_P" link set lo up
	NS_D=$NS_P ADDR_P=127.0.0.1 ADDR_D=127.0.0.1 DEV=lo
	write_conf prefill0 "127.0.0.1:7400" decode0 "127.0.0.1:7401" "$EXTRA_CONF"
	write_conf decode0 "127.0.0.1:7401" prefill0 "127.0.0.1:7400" "$EXTRA_CONF"
	up_pair "$NS_P" "$NS_D"
	PATH_NAME="loopback in one namespace"
else
	start_pair 91 "$EXTRA_CONF"
	DEV=$VETH_D
	PATH_NAME="veth between two namespaces"
fi
log "path: $PATH_NAME; congestion control: ${CC:-$(in_ns "$NS_P" sysctl -n net.ipv4.tcp_congestion_control)}"

links=$(ctl prefill0 --json peers | python3 -c 'import json,sys; print(json.load(sys.stdin)["peers"][0]["links_up"])')
log "kvproxy: $links TCP connection(s) to the peer (tcp.connections)"

spawn "$NS_D" "$KVP_TMP/iperf3-server.log" - iperf3 -s -B "$ADDR_D" -p 5201
# record NAME GBPS: one sample of a series.
record() { echo "$2" >>"$KVP_TMP/series.$1"; }
# TCP segments retransmitted in the sending namespace since the last call.
retrans() {
	local now prev
	now=$(in_ns "$NS_P" nstat -az TcpRetransSegs 2>/dev/null | awk '/TcpRetransSegs/ {print $2}')
	prev=$(cat "$KVP_TMP/retrans" 2>/dev/null || echo "$now")
	echo "$now" >"$KVP_TMP/retrans"
	echo $((now - prev))
}
retrans >/dev/null

# iperf STREAMS: one 5 s run, recorded as iperf3-P<STREAMS>.
iperf() {
	local g dl
	dl=$(deadline_in 20)
	# The server may not listen yet: retry until a run reports a result.
	until in_ns "$NS_P" iperf3 -c "$ADDR_D" -p 5201 -t 5 -l 1M -P "$1" ${CC:+-C "$CC"} -J \
		>"$KVP_TMP/iperf3.json" 2>/dev/null &&
		grep -q '"sum_received"' "$KVP_TMP/iperf3.json"; do
		before "$dl" || setup_fail "iperf3 client could not reach the server"
		sleep "$KVP_POLL"
	done
	g=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.3f" % (d["end"]["sum_received"]["bits_per_second"]/1e9))' "$KVP_TMP/iperf3.json")
	log "iperf3 -P $1: $g Gbit/s, $(retrans) retransmitted segments"
	record "iperf3-P$1" "$g"
}

# ucx TEST SEG: one ucx_perftest run over UCX's TCP transport, recorded as ucx-TEST-SEG.
ucx() {
	local n g
	n=$((4 * 1024 * 1024 * 1024 / $2))
	((n > 4000)) && n=4000
	spawn "$NS_D" "$KVP_TMP/ucx-server.log" - env UCX_TLS=tcp UCX_NET_DEVICES="$DEV" \
		ucx_perftest -p 13337
	local srv=$SPAWNED dl
	dl=$(deadline_in 20)
	until in_ns "$NS_P" env UCX_TLS=tcp UCX_NET_DEVICES="$([[ $DEV == lo ]] && echo lo || echo "$VETH_P")" \
		ucx_perftest "$ADDR_D" -p 13337 -t "$1" -s "$2" -n "$n" -w 20 >"$KVP_TMP/ucx.out" 2>&1; do
		before "$dl" || setup_fail "ucx_perftest client could not reach the server: $(tail -3 "$KVP_TMP/ucx.out")"
		sleep "$KVP_POLL"
	done
	wait_pid "$srv" 30 || true
	# Final: iterations, latencies (typical, average, overall), bandwidth MB/s (average, overall), ...
	g=$(awk '/^Final:/ {printf "%.3f", $7 * 1048576 * 8 / 1e9}' "$KVP_TMP/ucx.out")
	[[ -n $g ]] || setup_fail "ucx_perftest printed no result: $(tail -3 "$KVP_TMP/ucx.out")"
	log "ucx $1 $2: $g Gbit/s (overall), $(retrans) retransmitted segments"
	record "ucx-$1-$2" "$g"
}

# kvp NAME REP SEG EXTRA...: one verified run of $SIZE bytes in SEG-byte segments.
kvp() {
	local name=$1 r=$2 seg=$3 g key dpid
	shift 3
	key="$KVP_TMP/key.$name.$r"
	spawn "$NS_D" "$KVP_TMP/decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
		--size "$SIZE" --seed "$r" --key-file "$key" --min-seg "$seg" --max-seg "$seg" \
		--timeout 300 "$@"
	dpid=$SPAWNED
	in_ns "$NS_P" "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
		--key-file "$key" --size "$SIZE" --seed "$r" --min-seg "$seg" --max-seg "$seg" \
		--inflight 8 --json "$@" >"$KVP_TMP/prefill.json" ||
		fail "prefill run failed (segment $seg $*)"
	wait_pid "$dpid" 300 || fail "decode client did not verify the data (segment $seg)"
	g=$(json_get "$KVP_TMP/prefill.json" 'd["gbps"]')
	stats_json prefill0 >"$KVP_TMP/stats.json"
	log "$name run $r: $g Gbit/s, $(retrans) retransmitted segments (bytes per link so far: $(json_get "$KVP_TMP/stats.json" 'd["peers"][0]["link_tx_bytes"]'))"
	record "$name" "$g"
}

# Interleaved, so drift on a shared machine hits every series alike.
names=()
((NO_KV)) || for seg in "${SEGS[@]}"; do names+=("$seg"); done
((NO_KV)) || names+=(kv-64k-pages)
if ((UCX)); then
	for seg in "${SEGS[@]}"; do names+=("ucx-tag_bw-$seg" "ucx-ucp_am_bw-$seg"); done
fi
for ((r = 0; r < REPS; r++)); do
	iperf 1
	((links > 1)) && iperf "$links"
	if ((UCX)); then
		for seg in "${SEGS[@]}"; do
			ucx tag_bw "$seg"
			ucx ucp_am_bw "$seg"
		done
	fi
	((NO_KV)) && continue
	for seg in "${SEGS[@]}"; do
		kvp "$seg" "$r" "$seg" --segs-per-xfer 16
	done
	# KV-like: one request's 64 KiB pages, contiguous on both sides, 256 per transfer.
	kvp kv-64k-pages "$r" 65536 --segs-per-xfer 256 --linear
done

python3 - "$KVP_TMP" "$links" "$SIZE" "$JSON_OUT" "${names[@]}" <<'PY'
import json, statistics, sys
tmp, links, size, out, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
def series(n):
    return [float(l) for l in open("%s/series.%s" % (tmp, n))]
ip1 = series("iperf3-P1")
ipm = series("iperf3-P%d" % links) if links > 1 else ip1
ref = {"best": (max(ip1), max(ipm)), "median": (statistics.median(ip1), statistics.median(ipm))}
print("\n%-14s %8s %8s %9s %9s   (Gbit/s; ratios of iperf3 single / %d-stream)" %
      ("series", "best", "median", "x1 best", "x%d best" % links if links > 1 else "-", links))
print("%-22s %8.2f %8.2f %9s %9s" % ("iperf3", max(ip1), statistics.median(ip1), "1.00", "-"))
if links > 1:
    print("%-22s %8.2f %8.2f %9s %9s" % ("iperf3 -P%d" % links, max(ipm), statistics.median(ipm), "-", "1.00"))
runs = []
for n in names:
    v = series(n)
    b, m = max(v), statistics.median(v)
    r = {"segment": n, "gbps": b, "median_gbps": m, "ratio": b / ref["best"][0],
         "ratio_multi": b / ref["best"][1], "median_ratio": m / ref["median"][0],
         "median_ratio_multi": m / ref["median"][1], "samples": v}
    runs.append(r)
    print("%-22s %8.2f %8.2f %9.2f %9.2f   median ratios %.2f / %.2f" %
          (n, b, m, r["ratio"], r["ratio_multi"], r["median_ratio"], r["median_ratio_multi"]))
if out:
    json.dump({"iperf3_gbps": max(ip1), "iperf3_multi_gbps": max(ipm), "streams": links,
               "iperf3_samples": ip1, "iperf3_multi_samples": ipm, "size": size, "runs": runs},
              open(out, "w"), indent=1)
PY
