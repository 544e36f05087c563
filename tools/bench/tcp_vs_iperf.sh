#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Benchmark, not a test: kvproxy over TCP between two network namespaces
# against iperf3 and a plain TCP stream over the same veth, in one run,
# reported as ratios.
#
#   tools/bench/tcp_vs_iperf.sh [BUILD_DIR] [--size BYTES] [--reps N] [--json FILE]
#                               [--conf 'EXTRA CONFIG', e.g. 'tcp = { zerocopy = true; };']
#                               [--segs 65536,1048576,4194304] [--loopback] [--ucx]
#                               [--cc ALGORITHM] [--no-kv]
#
# --reps rounds, interleaved: iperf3 for 5 s (-l 1M) single-stream, with
# as many streams as kvproxy has connections to its peer (tcp.connections),
# and single-stream with its ends on the two workers' CPUs (iperf3-cpus,
# -A); with --ucx UCX's ucx_perftest tag_bw and ucp_am_bw over its TCP
# transport at each segment size (Debian: ucx-utils); kvp-tcp-stream, one
# TCP stream of --size bytes (after as many of warm-up) with its ends on
# the two workers' CPUs, from and into a --size buffer (tcp-stream-SIZE:
# distinct bytes, kvproxy-bench's footprint) and a 1 MiB one
# (tcp-stream-1m: iperf3's and UCX's footprint, which stays in the CPU
# caches), and one of each larger SEG-hot footprint (tcp-stream-4m for 4
# MiB segments); then kvproxy-bench moving --size bytes per segment size
# and the KV pattern, and per segment size the same bytes again and again
# (SEG-hot: a region of max(1 MiB, SEG) sent --size / region times with
# --rounds, 8 transfers in flight over it: iperf3's footprint, and the
# plain stream of the same span its reference). --loopback: both daemons on 127.0.0.1 in
# one namespace instead of a veth pair. --cc: the TCP congestion control
# for everyone (kvproxy's tcp.congestion, iperf3 -C, kvp-tcp-stream --cc;
# UCX's sockets keep the namespace's default). Best and median of each
# series; kvproxy figures as ratios of both iperf3s and of the plain stream
# of their footprint; per series the TCP retransmissions and what they
# were (nstat: tail loss probes, fast and slow-start retransmits, timeouts,
# DSACKs = spurious retransmits, reordering, receive-side drops and
# out-of-order queueing; netdev backlog drops from /proc/net/softnet_stat).
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
	-h | --help) sed -n 3,32p "$0"; exit 0 ;;
	*) BUILD=$(cd "$1" && pwd); shift ;;
	esac
done
export KVPROXYD=$BUILD/app/kvproxyd KVPROXYCTL=$BUILD/tools/kvproxyctl/kvproxyctl
export KVPROXY_BENCH=$BUILD/tools/bench/kvproxy-bench
STREAM=$BUILD/tools/bench/kvp-tcp-stream

# shellcheck source=../../tests/integ/lib.sh
source "$ROOT/tests/integ/lib.sh"
KVP_TEST=bench_tcp
require_netns
require_bins
[[ -x $STREAM ]] || setup_fail "$STREAM is not built"
command -v iperf3 >/dev/null || setup_fail "iperf3 is not installed (apt-get install iperf3)"
((UCX == 0)) || command -v ucx_perftest >/dev/null ||
	setup_fail "ucx_perftest is not installed (apt-get install ucx-utils)"
init_test
# Both daemons get EAL lcores 0,1; on one host their workers would share a
# CPU. The decode daemon's main lcore goes to CPU 1 so its worker runs on 0,
# as two hosts would have it (override with KVP_EAL_DECODE).
export KVP_EAL_DECODE=${KVP_EAL_DECODE---main-lcore 1}
# --cc joins a tcp group that --conf has (libconfig refuses a second one).
if [[ -n $CC && $EXTRA_CONF == *"tcp = {"* ]]; then
	EXTRA_CONF=${EXTRA_CONF/tcp = \{/tcp = \{ congestion = \"$CC\";}
elif [[ -n $CC ]]; then
	EXTRA_CONF="$EXTRA_CONF tcp = { congestion = \"$CC\"; };"
fi
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
# The workers' CPUs (EAL lcore ids are CPU ids): where the plain stream's ends run.
CPU_P=$(worker_lcores prefill0)
CPU_P=${CPU_P%%,*}
CPU_D=$(worker_lcores decode0)
CPU_D=${CPU_D%%,*}
log "kvp-tcp-stream and iperf3-cpus: sender on CPU $CPU_P (prefill0's worker), receiver on CPU $CPU_D (decode0's worker); iperf3 -P, UCX where the scheduler puts them"

# SIZE as a series name: 1g, 512m, 64k or bytes.
size_name() {
	local b=$1
	if ((b % (1 << 30) == 0)); then echo "$((b >> 30))g"
	elif ((b % (1 << 20) == 0)); then echo "$((b >> 20))m"
	elif ((b % 1024 == 0)); then echo "$((b >> 10))k"
	else echo "$b"; fi
}
COLD=tcp-stream-$(size_name "$SIZE")
[[ $COLD != tcp-stream-1m ]] || setup_fail "--size 1m: the cold and the hot plain stream would be the same"

spawn "$NS_D" "$KVP_TMP/iperf3-server.log" - iperf3 -s -B "$ADDR_D" -p 5201
# The plain stream's sinks, one per footprint, resident for the whole run.
spawn "$NS_D" "$KVP_TMP/sink-hot.log" - taskset -c "$CPU_D" "$STREAM" sink --addr "$ADDR_D:5202" \
	--span 1m ${CC:+--cc "$CC"}
spawn "$NS_D" "$KVP_TMP/sink-cold.log" - taskset -c "$CPU_D" "$STREAM" sink --addr "$ADDR_D:5203" \
	--span "$SIZE" ${CC:+--cc "$CC"}
# SEG-hot's region: one segment, at least iperf3's 1 MiB (then 1 MiB / SEG segments per transfer).
hot_size() { local h=$1; ((h < 1048576)) && h=1048576; echo "$h"; }
# Plain streams of the SEG-hot footprints above 1 MiB, a sink each (ports 5204 on).
HOT_SPANS=()
if ((NO_KV == 0)); then
	for seg in "${SEGS[@]}"; do
		h=$(hot_size "$seg")
		((h == 1048576)) || [[ " ${HOT_SPANS[*]} " == *" $h "* ]] || HOT_SPANS+=("$h")
	done
fi
for i in "${!HOT_SPANS[@]}"; do
	spawn "$NS_D" "$KVP_TMP/sink-hot$i.log" - taskset -c "$CPU_D" "$STREAM" sink \
		--addr "$ADDR_D:$((5204 + i))" --span "${HOT_SPANS[$i]}" ${CC:+--cc "$CC"}
done

# record NAME GBPS BYTES: one sample of a series, BYTES moved while its
# TCP counters were counted.
record() { echo "$2 $3" >>"$KVP_TMP/series.$1"; }

# Where retransmissions come from. The sender's side (in the sending
# namespace): tail loss probes, fast and slow-start retransmits, RTOs (and
# those F-RTO found spurious), retransmits lost again, segments a DSACK
# reported received twice (the retransmit was spurious), reordering
# detected by SACK or timestamps. The receiver's side: out-of-order
# queueing, drops for a full receive queue, prune or socket backlog. And
# the netdev backlog drops of every CPU (softnet_stat, not per namespace).
TX_CTRS=(TcpRetransSegs TcpExtTCPLossProbes TcpExtTCPFastRetrans TcpExtTCPSlowStartRetrans
	TcpExtTCPTimeouts TcpExtTCPSpuriousRTOs TcpExtTCPLostRetransmit TcpExtTCPDSACKRecvSegs
	TcpExtTCPSACKReorder TcpExtTCPTSReorder)
RX_CTRS=(TcpExtTCPOFOQueue TcpExtTCPOFODrop TcpExtPruneCalled TcpExtTCPBacklogDrop TcpExtTCPRcvQDrop)
# snapshot FILE: those counters now, "NAME VALUE" per line.
snapshot() {
	local dropped total=0
	{
		in_ns "$NS_P" nstat -asz | awk -v want="${TX_CTRS[*]}" \
			'BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) k[w[i]] = 1 } $1 in k { print $1, $2 }'
		in_ns "$NS_D" nstat -asz | awk -v want="${RX_CTRS[*]}" \
			'BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) k[w[i]] = 1 } $1 in k { print $1, $2 }'
		# Column 2 of each CPU's line: packets dropped for a full input queue (hex).
		while read -r _ dropped _; do
			total=$((total + 16#$dropped))
		done </proc/net/softnet_stat
		echo "SoftnetDropped $total"
	} >"$1"
}
# net_delta NAME: the counters' change since the last call, added to series
# NAME; prints the retransmitted segments.
net_delta() {
	snapshot "$KVP_TMP/net.now"
	awk 'NR == FNR { prev[$1] = $2; next } { print $1, $2 - prev[$1] }' "$KVP_TMP/net.prev" \
		"$KVP_TMP/net.now" >"$KVP_TMP/net.delta"
	cat "$KVP_TMP/net.delta" >>"$KVP_TMP/net.$1"
	mv "$KVP_TMP/net.now" "$KVP_TMP/net.prev"
	awk '$1 == "TcpRetransSegs" { print $2 }' "$KVP_TMP/net.delta"
}
snapshot "$KVP_TMP/net.prev"

# iperf STREAMS [NAME -A CPUS]: one 5 s run, recorded as iperf3-P<STREAMS> (or NAME).
iperf() {
	local g b dl name=${2:-iperf3-P$1}
	dl=$(deadline_in 20)
	# The server may not listen yet: retry until a run reports a result.
	until in_ns "$NS_P" iperf3 -c "$ADDR_D" -p 5201 -t 5 -l 1M -P "$1" ${CC:+-C "$CC"} "${@:3}" -J \
		>"$KVP_TMP/iperf3.json" 2>/dev/null &&
		grep -q '"sum_received"' "$KVP_TMP/iperf3.json"; do
		before "$dl" || setup_fail "iperf3 client could not reach the server"
		sleep "$KVP_POLL"
	done
	read -r g b < <(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["end"]["sum_received"]; print("%.3f %d" % (s["bits_per_second"]/1e9, s["bytes"]))' "$KVP_TMP/iperf3.json")
	log "$name: $g Gbit/s, $(net_delta "$name") retransmitted segments"
	record "$name" "$g" "$b"
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
	log "ucx $1 $2: $g Gbit/s (overall), $(net_delta "ucx-$1-$2") retransmitted segments"
	record "ucx-$1-$2" "$g" "$((n * $2))"
}

# stream NAME PORT SPAN: one kvp-tcp-stream run of $SIZE bytes from a SPAN
# buffer into the sink at PORT, its ends on the two workers' CPUs. After as
# many bytes of warm-up: kvproxy's links are long-lived, and a fresh
# connection's first second is slower (0.7x at 1 GiB on loopback here).
stream() {
	local name=$1 port=$2 span=$3 g
	in_ns "$NS_P" taskset -c "$CPU_P" "$STREAM" source --addr "$ADDR_D:$port" --span "$span" \
		--warmup "$SIZE" --total "$SIZE" ${CC:+--cc "$CC"} --json >"$KVP_TMP/stream.json" ||
		fail "kvp-tcp-stream $name failed"
	g=$(json_get "$KVP_TMP/stream.json" 'd["gbps"]')
	log "$name: $g Gbit/s, $(net_delta "$name") retransmitted segments (its socket:" \
		"$(json_get "$KVP_TMP/stream.json" '"%(total_retrans)d retransmits, %(dsack_dups)d DSACKs, reordering seen %(reord_seen)d, rtt %(rtt_us)d us" % d["tcp_info"]'))"
	record "$name" "$g" "$((2 * SIZE))" # the counters saw the warm-up too
}

# kvp NAME REP SEG BYTES EXTRA...: one verified kvproxy-bench run of BYTES
# (the regions' size) in SEG-byte segments.
kvp() {
	local name=$1 r=$2 seg=$3 bytes=$4 g key dpid
	shift 4
	key="$KVP_TMP/key.$name.$r"
	spawn "$NS_D" "$KVP_TMP/decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
		--size "$bytes" --seed "$r" --key-file "$key" --min-seg "$seg" --max-seg "$seg" \
		--timeout 300 "$@"
	dpid=$SPAWNED
	in_ns "$NS_P" "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
		--key-file "$key" --size "$bytes" --seed "$r" --min-seg "$seg" --max-seg "$seg" \
		--inflight 8 --json "$@" >"$KVP_TMP/prefill.json" ||
		fail "prefill run failed (segment $seg $*)"
	wait_pid "$dpid" 300 || fail "decode client did not verify the data (segment $seg)"
	g=$(json_get "$KVP_TMP/prefill.json" 'd["gbps"]')
	stats_json prefill0 >"$KVP_TMP/stats.json"
	log "$name run $r: $g Gbit/s, $(net_delta "$name") retransmitted segments (bytes per link so far: $(json_get "$KVP_TMP/stats.json" 'd["peers"][0]["link_tx_bytes"]'))"
	record "$name" "$g" "$(json_get "$KVP_TMP/prefill.json" 'd["bytes"]')"
}

if ((NO_KV == 0)); then
	for seg in "${SEGS[@]}"; do
		h=$(hot_size "$seg")
		log "$seg-hot: a $h-byte region sent $((SIZE / h > 0 ? SIZE / h : 1)) times (kvproxy-bench --rounds)"
	done
fi

# Interleaved, so drift on a shared machine hits every series alike.
names=(iperf3-cpus tcp-stream-1m "$COLD")
for h in "${HOT_SPANS[@]}"; do names+=("tcp-stream-$(size_name "$h")"); done
((NO_KV)) || for seg in "${SEGS[@]}"; do names+=("$seg"); done
((NO_KV)) || names+=(kv-64k-pages)
((NO_KV)) || for seg in "${SEGS[@]}"; do names+=("$seg-hot"); done
if ((UCX)); then
	for seg in "${SEGS[@]}"; do names+=("ucx-tag_bw-$seg" "ucx-ucp_am_bw-$seg"); done
fi
for ((r = 0; r < REPS; r++)); do
	iperf 1
	((links > 1)) && iperf "$links"
	iperf 1 iperf3-cpus -A "$CPU_P,$CPU_D"
	if ((UCX)); then
		for seg in "${SEGS[@]}"; do
			ucx tag_bw "$seg"
			ucx ucp_am_bw "$seg"
		done
	fi
	stream tcp-stream-1m 5202 1m
	stream "$COLD" 5203 "$SIZE"
	for i in "${!HOT_SPANS[@]}"; do
		stream "tcp-stream-$(size_name "${HOT_SPANS[$i]}")" $((5204 + i)) "${HOT_SPANS[$i]}"
	done
	((NO_KV)) && continue
	for seg in "${SEGS[@]}"; do
		kvp "$seg" "$r" "$seg" "$SIZE" --segs-per-xfer 16
	done
	# KV-like: one request's 64 KiB pages, contiguous on both sides, 256 per transfer.
	kvp kv-64k-pages "$r" 65536 "$SIZE" --segs-per-xfer 256 --linear
	# iperf3's footprint: the same few MiB again and again.
	for seg in "${SEGS[@]}"; do
		h=$(hot_size "$seg")
		kvp "$seg-hot" "$r" "$seg" "$h" --segs-per-xfer $((h / seg)) --rounds $((SIZE / h > 0 ? SIZE / h : 1))
	done
done

python3 - "$KVP_TMP" "$links" "$SIZE" "$JSON_OUT" "$COLD" "${names[@]}" <<'PY'
import json, statistics, sys
tmp, links, size, out, cold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
names = sys.argv[6:]
def series(n):
    rows = [l.split() for l in open("%s/series.%s" % (tmp, n))]
    return [float(r[0]) for r in rows], sum(int(float(r[1])) for r in rows)
def net(n):
    tot = {}
    try:
        for l in open("%s/net.%s" % (tmp, n)):
            k, v = l.split()
            tot[k] = tot.get(k, 0) + int(float(v))
    except FileNotFoundError:
        pass
    return tot
def footprint(n):
    """
    The reference of the same memory footprint and CPUs: hot = one buffer
    reused (iperf3, UCX), cold = distinct bytes (kvproxy-bench). The plain
    stream's own checks: at 1 MiB against iperf3 on the same CPUs, at
    --size against itself at 1 MiB (what distinct bytes cost a TCP stream).
    """
    refs = {"iperf3-cpus": None, "tcp-stream-1m": "iperf3-cpus", cold: "tcp-stream-1m"}
    if n in refs:
        return refs[n]
    if n.endswith("-hot"):  # the plain stream of its region's span (hot_size)
        return "tcp-stream-" + size_name(max(1 << 20, int(n[:-4])))
    return "tcp-stream-1m" if n.startswith("tcp-stream-") or n.startswith("ucx-") else cold
def size_name(b):
    for shift, unit in ((30, "g"), (20, "m"), (10, "k")):
        if b % (1 << shift) == 0:
            return "%d%s" % (b >> shift, unit)
    return str(b)
ip1, _ = series("iperf3-P1")
ipm, _ = series("iperf3-P%d" % links) if links > 1 else (ip1, 0)
best = {n: max(series(n)[0]) for n in names}
med = {n: statistics.median(series(n)[0]) for n in names}
multi = "x%d best" % links if links > 1 else "-"
print("\n%-22s %8s %8s %9s %9s %9s  %-16s %s" % ("series", "best", "median", "x1 best", multi,
      "xref best", "ref (footprint)", "median ratios x1 / ref"))
print("%-22s %8.2f %8.2f %9s %9s" % ("iperf3", max(ip1), statistics.median(ip1), "1.00", "-"))
if links > 1:
    print("%-22s %8.2f %8.2f %9s %9s" % ("iperf3 -P%d" % links, max(ipm), statistics.median(ipm), "-", "1.00"))
runs = []
for n in names:
    v, nbytes = series(n)
    b, m = best[n], med[n]
    ref = footprint(n)
    r = {"segment": n, "gbps": b, "median_gbps": m, "ratio": b / max(ip1),
         "ratio_multi": b / max(ipm), "median_ratio": m / statistics.median(ip1),
         "median_ratio_multi": m / statistics.median(ipm), "samples": v, "bytes": nbytes,
         "ref": ref, "ratio_ref": b / best[ref] if ref else None,
         "median_ratio_ref": m / med[ref] if ref else None, "net": net(n)}
    runs.append(r)
    print("%-22s %8.2f %8.2f %9.2f %9.2f %9s  %-16s %.2f / %s" %
          (n, b, m, r["ratio"], r["ratio_multi"], "%.2f" % r["ratio_ref"] if ref else "-",
           ref or "-", r["median_ratio"],
           "%.2f" % r["median_ratio_ref"] if ref else "-"))
print("(ref: kvproxy SEG and kv-64k-pages move distinct bytes: %s; SEG-hot resends a region of\n"
      " max(1 MiB, SEG): the stream of that span; UCX reuses its buffer: tcp-stream-1m; that one against\n"
      " iperf3 -l 1M on the same CPUs, %s and larger hot spans against it)" % (cold, cold))
cols = [("TcpRetransSegs", "rtx"), ("TcpExtTCPLossProbes", "TLP"), ("TcpExtTCPFastRetrans", "fast"),
        ("TcpExtTCPSlowStartRetrans", "slowst"), ("TcpExtTCPTimeouts", "RTO"),
        ("TcpExtTCPSpuriousRTOs", "spurRTO"), ("TcpExtTCPLostRetransmit", "lostrtx"),
        ("TcpExtTCPDSACKRecvSegs", "dsack"), ("TcpExtTCPSACKReorder", "sackreo"),
        ("TcpExtTCPTSReorder", "tsreo"), ("TcpExtTCPOFOQueue", "ofoq"), ("TcpExtTCPOFODrop", "ofodrop"),
        ("TcpExtPruneCalled", "prune"), ("TcpExtTCPBacklogDrop", "bklog"),
        ("TcpExtTCPRcvQDrop", "rcvq"), ("SoftnetDropped", "netdev")]
print("\nTCP counters per series, all its runs (sender's namespace; ofoq..rcvq the receiver's; netdev: softnet_stat drops, all CPUs)")
print("%-22s %6s %7s " % ("series", "GiB", "rtx/GiB") + " ".join("%7s" % c[1] for c in cols))
for n in ["iperf3-P1"] + (["iperf3-P%d" % links] if links > 1 else []) + names:
    t, gib = net(n), series(n)[1] / 2**30
    print("%-22s %6.2f %7.1f " % (n, gib, t.get("TcpRetransSegs", 0) / gib if gib else 0) +
          " ".join("%7d" % t.get(c[0], 0) for c in cols))
if out:
    json.dump({"iperf3_gbps": max(ip1), "iperf3_multi_gbps": max(ipm), "streams": links,
               "iperf3_samples": ip1, "iperf3_multi_samples": ipm, "size": size, "runs": runs,
               "iperf3_net": net("iperf3-P1")},
              open(out, "w"), indent=1)
PY
