#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Bounded soak: two kvproxyd in network namespaces (tests/integ/lib.sh) under
# continuous mixed traffic (kvproxy-bench prefill/decode pairs in loops) while
# a seeded fault injector, one fault at a time, kills -9 and restarts the
# decode node, flaps the link, drops packets (nftables numgen), throttles
# the link (tc tbf) and kills clients. Then it stops, lets the nodes settle
# and checks:
#   - every submitted transfer ended: each prefill client that was not killed
#     got a completion for every transfer (none stalled), none later than its
#     deadline + slack, only typed statuses a fault explains (never invalid /
#     no-peer / canceled / shutdown), and both nodes end with nothing in flight;
#   - every byte that landed verifies (decode clients: 0 mismatches, no bad or
#     duplicate landing notice) unless its node was killed under it;
#   - pools are whole again (staging.in_use == 0, totals.inflight == 0);
#   - kvproxyd's own RSS (all resident pages but the clients' regions),
#     sampled every 0.5 s, stays within a bound computed from the config
#     (EAL memory + channels + control-plane buffers + slack);
#   - the prefill node (never restarted) has as many fds at the end as at the
#     start.
# Prints one summary line (transfers, faults by type, failures by status,
# bytes verified, max RSS vs bound) and exits 0 if every check held, 1 if
# not, 77 if it cannot run here (needs root, iproute2), 99 if set-up broke.
#
# Usage (as root): tools/soak.sh [--short] [--duration SEC] [--seed N] [--builddir DIR]
#   --short          about 45 s of faults (CI); the default is about 3 minutes
#   --duration SEC   seconds of traffic under faults (default 180, --short 45)
#   --seed N         fault and traffic schedule (default: from the clock, printed)
#   --builddir DIR   where kvproxyd, kvproxyctl, kvproxy-bench are (default build);
#                    KVPROXYD, KVPROXYCTL, KVPROXY_BENCH override
# KVP_KEEP=1 keeps the temp dir (logs, per-pair outputs, RSS samples).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
duration=180
seed=$(( $(date +%s) % 100000 ))
builddir=build
while [[ $# -gt 0 ]]; do
	case $1 in
	--short) duration=45 ;;
	--duration) duration=$2; shift ;;
	--seed) seed=$2; shift ;;
	--builddir) builddir=$2; shift ;;
	-h | --help) sed -n '3,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
	shift
done
[[ $builddir == /* ]] || builddir=$root/$builddir
export KVPROXYD=${KVPROXYD:-$builddir/app/kvproxyd}
export KVPROXYCTL=${KVPROXYCTL:-$builddir/tools/kvproxyctl/kvproxyctl}
export KVPROXY_BENCH=${KVPROXY_BENCH:-$builddir/tools/bench/kvproxy-bench}

# lib.sh names the test after $0: "soak".
# shellcheck source=../tests/integ/lib.sh
. "$root/tests/integ/lib.sh"
KVP_OK_WORD="soak: all checks held"

require_netns
require_bins
init_test
RANDOM=$seed
log "seed $seed, ${duration}s of traffic under faults"

PEER_MS=1000
XFER_TIMEOUT_MS=15000
DEADLINE_SLACK_MS=5000
EAL_MB=256
for ((i = 0; i < ${#KVP_EAL[@]}; i++)); do
	[[ ${KVP_EAL[i]} == -m ]] && EAL_MB=${KVP_EAL[i + 1]}
done
# RSS bound. Client regions are the clients' memfds that kvproxyd maps
# ("/memfd:kvp-region"): their pages are the clients' memory and are not
# counted. Everything else kvproxyd maps is its own: EAL memory (the fixed
# pool every DPDK allocation comes from: staging pool, rings, transfer tables;
# "/memfd:nohuge" without hugepages), client channels (max_clients x
# (sq 4096 x 64 B + cq 1024 x 128 B + 4 KiB)), admin line buffers (16 x 64 KiB),
# the stats text buffer (4 MiB), a 1 MiB reply buffer, code and libc/DPDK
# state (~30 MiB measured idle, no client). 64 MiB slack covers the last item.
CHAN_KB=$((4096 * 64 / 1024 + 1024 * 128 / 1024 + 4))
RSS_BOUND_MB=$((EAL_MB + (16 * CHAN_KB + 1023) / 1024 + 1 + 4 + 1 + 64))

command -v nft >/dev/null && HAVE_NFT=1 || HAVE_NFT=0
FAULTS=(kill_decode link_flap kill_client)
[[ $HAVE_NFT -eq 1 ]] && FAULTS+=(loss)

KVP_PEER_MS=$PEER_MS
# Mixed paths: prefill0 stages host memory through its bounce pool (both
# directions), decode0 sends and lands zero-copy; traffic runs both ways.
netns_pair 81
write_conf prefill0 "$ADDR_P:7400" decode0 "$ADDR_D:7400" 'stage = { host = true; };'
write_conf decode0 "$ADDR_D:7400" prefill0 "$ADDR_P:7400"
start_daemon prefill0 "$NS_P"
start_daemon decode0 "$NS_D"
wait_admin prefill0
wait_admin decode0
wait_peer_up prefill0 decode0
wait_peer_up decode0 prefill0
if ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate 1gbit burst 256kb latency 50ms 2>/dev/null; then
	ip netns exec "$NS_P" tc qdisc del dev "$VETH_P" root
	FAULTS+=(throttle)
fi
log "fault types: ${FAULTS[*]}"

S=$KVP_TMP/soak
mkdir -p "$S/pairs"
echo 0 >"$S/decode_gen" # bumped when decode0 is killed
pidfile() { echo "$S/daemon.$1.pid"; }
echo "${DPID[prefill0]}" >"$(pidfile prefill0)"
echo "${DPID[decode0]}" >"$(pidfile decode0)"

fd_count() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
FD0=$(fd_count "${DPID[prefill0]}")
log "prefill0 (pid ${DPID[prefill0]}) has $FD0 fds at the start"

# ---- RSS sampler ----
rss_sampler() {
	local n pid own total
	while [[ ! -e $S/stop.sampler ]]; do
		for n in prefill0 decode0; do
			pid=$(cat "$(pidfile $n)" 2>/dev/null) || continue
			# kB: all resident pages but the clients' regions; and VmRSS for reference.
			own=$(awk '/^[0-9a-f]+-[0-9a-f]+ / { client = ($6 ~ /^\/memfd:kvp-region/) }
				   /^Rss:/ { if (!client) own += $2 }
				   END { print own + 0 }' "/proc/$pid/smaps" 2>/dev/null) || continue
			total=$(awk '$1 == "VmRSS:" { print $2 }' "/proc/$pid/status" 2>/dev/null) || continue
			[[ -n $total && $own -gt 0 ]] && echo "$n $pid $own $total" >>"$S/rss"
		done
		sleep 0.5
	done
}
rss_sampler &
track $!

# ---- traffic: three loops of prefill/decode pairs (two to decode0, one back), from the seed ----
SIZES=(8m 16m 32m 64m)
SEGS=("4096 65536" "65536 1048576" "4096 8388608" "1048576 4194304")
KS=(4 16 64)
QS=(4 8 16)

# traffic_loop N SRC DST: pairs sending from node SRC's client to node DST's client.
traffic_loop() {
	local loop=$1 src=$2 dst=$3 n=0 tag size seg k q lin dec pre gen0 gen1 prc drc
	local src_ns=$NS_P dst_ns=$NS_D
	[[ $src == prefill0 ]] || { src_ns=$NS_D; dst_ns=$NS_P; }
	RANDOM=$((seed * 31 + loop))
	while [[ ! -e $S/stop.traffic ]]; do
		n=$((n + 1))
		tag=$S/pairs/l$loop-$(printf %04d $n)
		size=${SIZES[RANDOM % ${#SIZES[@]}]}
		seg=${SEGS[RANDOM % ${#SEGS[@]}]}
		k=${KS[RANDOM % ${#KS[@]}]}
		q=${QS[RANDOM % ${#QS[@]}]}
		lin=()
		((RANDOM % 4 == 0)) && lin=(--linear)
		local plan=(--size "$size" --seed "$((seed + loop * 100000 + n))" --min-seg "${seg% *}"
			--max-seg "${seg#* }" --segs-per-xfer "$k" "${lin[@]}")
		echo "$src->$dst $size seg ${seg% *}-${seg#* } k $k q $q ${lin[*]}" >"$tag.plan"
		gen0=$(cat "$S/decode_gen")
		rm -f "$tag.key" "$tag.stop"
		ip netns exec "$dst_ns" "$KVPROXY_BENCH" decode -s "$(sock_of "$dst")" "${plan[@]}" \
			--key-file "$tag.key" --stop-file "$tag.stop" --timeout 300 --json \
			>"$tag.dec.json" 2>"$tag.dec.err" &
		dec=$!
		echo "$dec" >"$tag.dec.pid"
		# decode0 may be down (killed by the injector): try again later.
		local dl=$((SECONDS + 15))
		while [[ ! -s $tag.key ]] && kill -0 "$dec" 2>/dev/null && ((SECONDS < dl)); do
			sleep 0.05
		done
		if [[ ! -s $tag.key ]]; then
			kill -KILL "$dec" 2>/dev/null || true
			wait "$dec" 2>/dev/null || true
			echo "nodecode" >"$tag.result"
			sleep 0.5
			continue
		fi
		ip netns exec "$src_ns" "$KVPROXY_BENCH" prefill -s "$(sock_of "$src")" --peer "$dst" \
			"${plan[@]}" --key-file "$tag.key" --inflight "$q" --timeout-ms "$XFER_TIMEOUT_MS" \
			--wait-key 5 --json >"$tag.pre.json" 2>"$tag.pre.err" &
		pre=$!
		echo "$pre" >"$tag.pre.pid"
		prc=0
		wait "$pre" || prc=$?
		touch "$tag.stop"
		drc=0
		wait "$dec" || drc=$?
		gen1=$(cat "$S/decode_gen")
		echo "pre $prc dec $drc gen $gen0 $gen1 src $src" >"$tag.result"
		[[ $prc -eq 0 ]] || sleep 0.3 # a node is down or the link is: do not spin
	done
}
LOOP_PIDS=()
traffic_loop 1 prefill0 decode0 &
track $!
LOOP_PIDS+=($!)
traffic_loop 2 prefill0 decode0 &
track $!
LOOP_PIDS+=($!)
traffic_loop 3 decode0 prefill0 &
track $!
LOOP_PIDS+=($!)

# ---- faults, one at a time ----
declare -A NFAULT=()
for f in "${FAULTS[@]}"; do NFAULT[$f]=0; done
KILLED_FILE=$S/killed_clients

fault_kill_decode() {
	local pid=${DPID[decode0]}
	# Renamed into place: the traffic loops read it at any moment, and a
	# rewrite in place can be caught empty.
	echo $(($(cat "$S/decode_gen") + 1)) >"$S/decode_gen.new"
	mv -f "$S/decode_gen.new" "$S/decode_gen"
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null || true
	untrack "$pid"
	sleep "0.$((RANDOM % 9 + 1))"
	start_daemon decode0 "$NS_D"
	echo "${DPID[decode0]}" >"$(pidfile decode0)"
	wait_admin decode0 30
}

fault_link_flap() {
	ip -n "$NS_P" link set "$VETH_P" down
	sleep "$((RANDOM % 3)).$((RANDOM % 10))"
	ip -n "$NS_P" link set "$VETH_P" up
}

fault_loss() {
	ip netns exec "$NS_D" nft -f - <<NFT
table inet kvpsoak {
	chain input {
		type filter hook input priority 0; policy accept;
		tcp dport 7400 numgen random mod 1000 < $((RANDOM % 30 + 5)) counter drop
	}
}
NFT
	sleep "$((RANDOM % 4 + 1))"
	ip netns exec "$NS_D" nft delete table inet kvpsoak
}

fault_throttle() {
	ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate "$((RANDOM % 400 + 100))mbit" \
		burst 256kb latency 50ms
	sleep "$((RANDOM % 4 + 1))"
	ip netns exec "$NS_P" tc qdisc del dev "$VETH_P" root
}

fault_kill_client() {
	local f pid cands=() i
	# A client of a pair still running (either side), chosen by the schedule.
	for f in "$S"/pairs/*.pid; do
		[[ -e $f && ! -e ${f%.*.pid}.result ]] && cands+=("$f")
	done
	for ((i = 0; i < ${#cands[@]}; i++)); do
		f=${cands[(i + RANDOM) % ${#cands[@]}]}
		pid=$(cat "$f")
		if kill -0 "$pid" 2>/dev/null && [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]; then
			echo "$pid" >>"$KILLED_FILE"
			kill -KILL "$pid" 2>/dev/null || true
			return 0
		fi
	done
	return 1
}

settle_peers() {
	wait_peer_up prefill0 decode0 60
	wait_peer_up decode0 prefill0 60
}

t_end=$((SECONDS + duration))
sleep 2
while ((SECONDS < t_end)); do
	f=${FAULTS[RANDOM % ${#FAULTS[@]}]}
	log "fault: $f"
	if "fault_$f"; then
		NFAULT[$f]=$((NFAULT[$f] + 1))
	else
		log "fault $f: nothing to do right now"
	fi
	daemon_alive prefill0 || fail "prefill0 died (fault $f)"
	settle_peers
	sleep "$((RANDOM % 3 + 1)).$((RANDOM % 10))"
done

# ---- wind down: no more faults, traffic finishes its current pairs ----
log "stopping traffic"
touch "$S/stop.traffic"
dl=$(deadline_in $((XFER_TIMEOUT_MS / 1000 + 90)))
for p in "${LOOP_PIDS[@]}"; do
	while kill -0 "$p" 2>/dev/null && before "$dl"; do sleep 0.2; done
	kill -0 "$p" 2>/dev/null && fail "traffic loop $p did not finish its last pair (a client hung)"
	wait "$p" 2>/dev/null || true
	untrack "$p"
done
settle_peers
for n in prefill0 decode0; do
	wait_json "$n" stats 'd["totals"]["inflight"] == 0 and d["staging"]["in_use"] == 0 and d["clients"] == []' 60 \
		"$n: nothing in flight, staging pool whole, no clients"
done
touch "$S/stop.sampler"
# Closing connections may take a moment to give their fds back.
dl=$(deadline_in 15)
FD1=$(fd_count "${DPID[prefill0]}")
while [[ $FD1 -ne $FD0 ]] && before "$dl"; do
	sleep 0.5
	FD1=$(fd_count "${DPID[prefill0]}")
done
stats_json prefill0 >"$S/prefill0.stats.json"
stats_json decode0 >"$S/decode0.stats.json"

# ---- verdict ----
faults=""
for f in "${FAULTS[@]}"; do faults+="$f=${NFAULT[$f]} "; done
rc=0
python3 - "$S" "$XFER_TIMEOUT_MS" "$DEADLINE_SLACK_MS" "$RSS_BOUND_MB" "$FD0" "$FD1" \
	"${faults% }" "$seed" <<'EOF' || rc=$?
import glob, json, os, sys

S, tmo, slack, bound_mb, fd0, fd1, faults, seed = sys.argv[1:9]
tmo, slack, bound_mb, fd0, fd1 = int(tmo), int(slack), int(bound_mb), int(fd0), int(fd1)
killed = set()
if os.path.exists(os.path.join(S, "killed_clients")):
    killed = {l.strip() for l in open(os.path.join(S, "killed_clients")) if l.strip()}

def read(p):
    try:
        return open(p).read()
    except OSError:
        return ""

problems = []
xfers = ok = 0
status = {}
bytes_verified = 0
pairs = aborted = nodecode = 0
for res in sorted(glob.glob(os.path.join(S, "pairs", "*.result"))):
    tag = res[:-len(".result")]
    name = os.path.basename(tag)
    r = read(res).split()
    if r == ["nodecode"]:
        nodecode += 1
        continue
    pairs += 1
    if len(r) != 9 or not all(x.lstrip("-").isdigit() for x in (r[1], r[3])):
        problems.append("%s: unreadable result line %r" % (name, " ".join(r)))
        continue
    prc, drc, g0, g1, src = int(r[1]), int(r[3]), r[5], r[6], r[8]
    pre_pid, dec_pid = read(tag + ".pre.pid").strip(), read(tag + ".dec.pid").strip()
    pre_killed, dec_killed = pre_pid in killed, dec_pid in killed
    # decode0 killed during the pair: its client (either role) may die with it
    decode_node_died = g0 != g1
    dec_node_died = decode_node_died and src == "prefill0"
    pre_err, dec_err = read(tag + ".pre.err"), read(tag + ".dec.err")
    # prefill: every transfer completed (a killed client's are reclaimed by the daemon)
    # A prefill client dies with its node (reverse loop), or loses its
    # destination's key file when decode0 dies under the decode client.
    no_summary = not read(tag + ".pre.json").strip()
    if no_summary and src == "decode0" and "kvproxy-bench: connect " in pre_err:
        nodecode += 1  # decode0 was still restarting: nothing was submitted
        pairs -= 1
        continue
    if pre_killed or (no_summary and decode_node_died and "stalled" not in pre_err):
        aborted += 1
    else:
        try:
            pj = json.loads(read(tag + ".pre.json").strip().splitlines()[-1])
        except (IndexError, ValueError):
            problems.append("%s: prefill ended without its summary (exit %d): %s"
                            % (name, prc, pre_err.strip()[-300:]))
            pj = None
        if pj:
            n = pj["xfers"]
            st = {k: v for k, v in pj["status"].items() if v}
            if sum(st.values()) != n:
                problems.append("%s: %d transfers but %d completions" % (name, n, sum(st.values())))
            for k, v in st.items():
                status[k] = status.get(k, 0) + v
                if k not in ("ok", "peer", "timeout", "remote", "no-buffers"):
                    problems.append("%s: %d transfers ended '%s'" % (name, v, k))
            xfers += n
            ok += st.get("ok", 0)
            if pj["lat_us"]["max"] > (tmo + slack) * 1000:
                problems.append("%s: a transfer ended %.1f s after submit (deadline %d ms + %d ms slack)"
                                % (name, pj["lat_us"]["max"] / 1e6, tmo, slack))
            if prc not in (0, 1):
                problems.append("%s: prefill exit %d" % (name, prc))
    # decode: what landed verifies
    dj = None
    try:
        dj = json.loads(read(tag + ".dec.json").strip().splitlines()[-1])
    except (IndexError, ValueError):
        pass
    if dj:
        bytes_verified += dj["bytes"] if dj["mismatches"] == 0 else 0
        if dj["mismatches"]:
            problems.append("%s: %d bytes landed wrong (first at %d)" % (name, dj["mismatches"], dj["first_mismatch"]))
    elif not (dec_killed or dec_node_died):
        problems.append("%s: decode client failed (exit %d) while its node lived: %s"
                        % (name, drc, dec_err.strip()[-300:]))
    if "bad LANDED" in dec_err or "landed" in dec_err and "plan says" in dec_err:
        problems.append("%s: %s" % (name, dec_err.strip()[-300:]))
    if "stalled" in pre_err:
        problems.append("%s: prefill stalled (a transfer never ended): %s" % (name, pre_err.strip()[-200:]))

rss = {}
for line in read(os.path.join(S, "rss")).splitlines():
    node, pid, anon, total = line.split()
    a, t = rss.get(node, (0, 0))
    rss[node] = (max(a, int(anon)), max(t, int(total)))
max_anon = max((a for a, _ in rss.values()), default=0) / 1024
max_total = max((t for _, t in rss.values()), default=0) / 1024
if not rss:
    problems.append("no RSS samples")
if max_anon > bound_mb:
    problems.append("kvproxyd's own RSS reached %.0f MiB, bound %d MiB" % (max_anon, bound_mb))
if fd1 != fd0:
    problems.append("prefill0 has %d fds at the end, %d at the start" % (fd1, fd0))
for n in ("prefill0", "decode0"):
    d = json.load(open(os.path.join(S, n + ".stats.json")))
    if d["totals"]["inflight"] or d["staging"]["in_use"]:
        problems.append("%s: inflight %d, staging in use %d at the end"
                        % (n, d["totals"]["inflight"], d["staging"]["in_use"]))

fails = " ".join("%s=%d" % (k, v) for k, v in sorted(status.items()) if k != "ok") or "none"
print("soak: seed %s: %d pairs (%d prefill clients killed or lost with their node, %d skipped: decode0 down at their start), "
      "%d transfers (%d ok), failures by status: %s; faults: %s; %.1f MiB verified; "
      "max kvproxyd RSS %.0f MiB / bound %d MiB (with client regions %.0f MiB); fds %d -> %d; %s"
      % (seed, pairs, aborted, nodecode, xfers, ok, fails, faults, bytes_verified / 2**20,
         max_anon, bound_mb, max_total, fd0, fd1, "PASS" if not problems else "FAIL"))
for p in problems[:30]:
    print("  problem: " + p)
if xfers == 0:
    print("  problem: no transfer completed at all")
    sys.exit(1)
sys.exit(1 if problems else 0)
EOF
[[ $rc -eq 0 ]] || fail "soak checks failed (seed $seed; rerun with --seed $seed, KVP_KEEP=1 keeps the logs)"
stop_daemon_checked prefill0
stop_daemon_checked decode0
