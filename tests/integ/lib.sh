# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# Helpers for the integ suite: network namespaces joined by a veth pair,
# kvproxyd configs and daemons, bounded waits, JSON checks.
#
# Source it from a test script (bash, set -euo pipefail). Binaries come
# from the environment (meson sets them): KVPROXYD, KVPROXYCTL, KVPROXY_BENCH.
# Exit codes: 0 pass, 1 fail, 77 skip (with the reason), 99 setup broke.
# Set KVP_KEEP=1 to keep the temp dir (configs, logs) after the test.

KVP_TEST=$(basename "$0" .sh)
KVP_TMP=""
KVP_PIDS=()     # every background process this test started
KVP_NETNS=()    # namespaces this test created
KVP_DAEMON_LOGS=()

log() { printf '[%s %s] %s\n' "$(date +%T.%3N)" "$KVP_TEST" "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }
skip() { log "SKIP: $*"; exit 77; }
setup_fail() { log "SETUP ERROR: $*"; exit 99; }

# Seconds (fractional) since the epoch, for bounded waits.
now() { date +%s.%N; }
# True while now < $1.
before() { awk -v d="$1" -v n="$(now)" 'BEGIN { exit !(n < d) }'; }
deadline_in() { awk -v s="$1" -v n="$(now)" 'BEGIN { printf "%.3f", n + s }'; }

# python3 through a version manager's shim (pyenv's is a bash script) costs
# 0.2 s a call on the development VM and seconds inside the rdma suite's TCG
# VM, and every JSON check below is one: the interpreter's own directory goes
# first in PATH, for this script and everything it starts.
if _kvp_py=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null) && [[ -x $_kvp_py ]]; then
	PATH=$(dirname "$_kvp_py"):$PATH
fi
unset _kvp_py

# Poll interval of the bounded waits below: they re-check a condition until a
# deadline, they never wait a fixed time for something to have happened.
KVP_POLL=0.1

# ---- preconditions ----

require_root() {
	[[ $(id -u) -eq 0 ]] || skip "needs root ($1)"
}

require_netns() {
	require_root "network namespaces, veth"
	command -v ip >/dev/null || skip "'ip' (iproute2) is not installed"
	local probe="kvpprobe$$"
	ip netns add "$probe" 2>/dev/null || skip "'ip netns add' does not work here (no netns support?)"
	ip netns del "$probe" || true
}

require_bins() {
	local v
	for v in KVPROXYD KVPROXYCTL KVPROXY_BENCH; do
		[[ -n ${!v:-} ]] || setup_fail "\$$v is not set (meson defines it from kvproxyd_exe, kvproxyctl_exe, kvproxy_bench_exe; run through 'meson test')"
		[[ -x ${!v} ]] || setup_fail "\$$v=${!v} is not an executable"
	done
	command -v python3 >/dev/null || setup_fail "python3 is needed for JSON checks"
}

# ---- temp dir and cleanup ----

init_test() {
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	KVP_TMP=$(mktemp -d "/tmp/kvp-${KVP_TEST#test_}.XXXXXX") || setup_fail "mktemp failed"
	log "temp dir $KVP_TMP"
}

# running_pid PID: true while PID runs. A zombie (visible to kill -0 until
# its parent reaps it) has stopped; so has a process whose /proc entry went
# between the two looks (reaped by a parent other than this shell).
running_pid() {
	local st
	kill -0 "$1" 2>/dev/null || return 1
	st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
	[[ -n $st && $st != Z ]]
}

# Stop one pid we started: TERM, bounded wait, then KILL. Returns its exit status.
stop_pid() {
	local pid=$1 limit=${2:-15} dl rc=0
	kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || rc=$?; return $rc; }
	kill -TERM "$pid" 2>/dev/null || true
	dl=$(deadline_in "$limit")
	while running_pid "$pid" && before "$dl"; do
		sleep "$KVP_POLL"
	done
	if running_pid "$pid"; then
		log "pid $pid did not stop within ${limit}s after TERM; sending KILL"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || rc=$?
	return $rc
}

cleanup() {
	local rc=$? i ns f
	set +e
	# Newest first: clients before the daemons they talk to.
	for ((i = ${#KVP_PIDS[@]} - 1; i >= 0; i--)); do
		stop_pid "${KVP_PIDS[i]}" 15 >/dev/null 2>&1
	done
	if [[ $rc -ne 0 && $rc -ne 77 ]]; then
		for f in "${KVP_DAEMON_LOGS[@]}"; do
			[[ -f $f ]] || continue
			log "---- last lines of $f ----"
			tail -n 40 "$f" >&2
		done
	fi
	for ns in "${KVP_NETNS[@]}"; do
		ip netns del "$ns" 2>/dev/null
	done
	for f in "${KVP_MEMCG[@]}"; do
		rmdir "$f" 2>/dev/null
	done
	if [[ -n $KVP_TMP && -d $KVP_TMP ]]; then
		if [[ -n ${KVP_KEEP:-} ]]; then
			log "kept $KVP_TMP"
		else
			rm -rf "$KVP_TMP"
		fi
	fi
	case $rc in
	0) log "${KVP_OK_WORD:-PASS}" ;;
	77) ;;
	*) log "exit $rc" ;;
	esac
	exit "$rc"
}

# Remember a background pid for cleanup.
track() { KVP_PIDS+=("$1"); }

# Forget a pid we already reaped ourselves.
untrack() {
	local p keep=()
	for p in "${KVP_PIDS[@]}"; do
		[[ $p == "$1" ]] || keep+=("$p")
	done
	KVP_PIDS=("${keep[@]}")
}

# kill9 PID WHAT: SIGKILL a client that must still be running (if it has
# finished, the test cannot test what it meant to: the clients' outputs, then
# a setup error), reap and forget it.
kill9() {
	if ! running_pid "$1"; then
		cat "$KVP_TMP"/*.out >&2 2>/dev/null || true
		setup_fail "$2 finished before it could be killed (transfer too fast for this test)"
	fi
	kill -KILL "$1"
	wait "$1" 2>/dev/null || true
	untrack "$1"
	log "killed $2 (pid $1) with SIGKILL"
}

# ---- network namespaces ----

# netns_pair SUBNET: namespaces $NS_P and $NS_D joined by a veth pair,
# addresses $ADDR_P=10.77.SUBNET.1 and $ADDR_D=10.77.SUBNET.2, loopback up in each.
# Names carry the pid so concurrent or leftover runs do not collide.
netns_pair() {
	local subnet=$1 tag=${KVP_TEST#test_}
	tag=${tag:0:2}
	NS_P="kvp-${KVP_TEST#test_}-$$-p"
	NS_D="kvp-${KVP_TEST#test_}-$$-d"
	VETH_P="kv${tag}$$p" # <= 2+2+7+1 chars, under IFNAMSIZ
	VETH_D="kv${tag}$$d"
	ADDR_P="10.77.${subnet}.1"
	ADDR_D="10.77.${subnet}.2"

	ip netns add "$NS_P" || setup_fail "ip netns add $NS_P"
	KVP_NETNS+=("$NS_P")
	ip netns add "$NS_D" || setup_fail "ip netns add $NS_D"
	KVP_NETNS+=("$NS_D")
	ip link add "$VETH_P" netns "$NS_P" type veth peer name "$VETH_D" netns "$NS_D" ||
		setup_fail "cannot create veth pair $VETH_P/$VETH_D"
	ip -n "$NS_P" addr add "$ADDR_P/24" dev "$VETH_P"
	ip -n "$NS_D" addr add "$ADDR_D/24" dev "$VETH_D"
	ip -n "$NS_P" link set lo up
	ip -n "$NS_D" link set lo up
	ip -n "$NS_P" link set "$VETH_P" up
	ip -n "$NS_D" link set "$VETH_D" up
	log "namespaces $NS_P ($ADDR_P) <-> $NS_D ($ADDR_D)"
}

# netns_bridge SUBNET N: N namespaces NS_NODE[0..N-1] on one bridge (in a
# namespace of its own, $NS_BR), node i at ADDR_NODE[i] = 10.77.SUBNET.(i+1),
# loopback up in each: one sender and several receivers, as on one switch.
netns_bridge() {
	local subnet=$1 n=$2 tag=${KVP_TEST#test_} i ns a b
	tag=${tag:0:2}
	NS_BR="kvp-${KVP_TEST#test_}-$$-br"
	ip netns add "$NS_BR" || setup_fail "ip netns add $NS_BR"
	KVP_NETNS+=("$NS_BR")
	ip -n "$NS_BR" link add br0 type bridge || setup_fail "cannot create a bridge in $NS_BR"
	ip -n "$NS_BR" link set br0 up
	NS_NODE=()
	ADDR_NODE=()
	for ((i = 0; i < n; i++)); do
		ns="kvp-${KVP_TEST#test_}-$$-n$i"
		a="kv${tag}$$n$i" # <= 2+2+7+1+2 chars, under IFNAMSIZ
		b="kv${tag}$$b$i"
		ip netns add "$ns" || setup_fail "ip netns add $ns"
		KVP_NETNS+=("$ns")
		ip link add "$a" netns "$ns" type veth peer name "$b" netns "$NS_BR" ||
			setup_fail "cannot create veth pair $a/$b"
		ip -n "$NS_BR" link set "$b" master br0
		ip -n "$NS_BR" link set "$b" up
		ip -n "$ns" addr add "10.77.$subnet.$((i + 1))/24" dev "$a"
		ip -n "$ns" link set lo up
		ip -n "$ns" link set "$a" up
		NS_NODE+=("$ns")
		ADDR_NODE+=("10.77.$subnet.$((i + 1))")
	done
	log "bridge $NS_BR: ${ADDR_NODE[*]}"
}

# in_ns NS CMD...: run CMD inside NS, or on the host when NS is empty.
in_ns() {
	local ns=$1
	shift
	if [[ -n $ns ]]; then
		ip netns exec "$ns" "$@"
	else
		"$@"
	fi
}

# spawn NS OUT ERR CMD...: run CMD in the background inside NS (NS empty: on
# the host), stdout to OUT, stderr to ERR (ERR "-": to OUT as well). Sets
# SPAWNED to CMD's own pid (a simple command started with & is exec'd by the
# forked shell, and 'ip netns exec' execs CMD), so signals reach CMD itself.
spawn() {
	local ns=$1 out=$2 err=$3
	shift 3
	if [[ -n $ns ]]; then
		set -- ip netns exec "$ns" "$@"
	fi
	if [[ $err == - ]]; then
		"$@" >"$out" 2>&1 &
	else
		"$@" >"$out" 2>"$err" &
	fi
	SPAWNED=$!
	track "$SPAWNED"
}

# ---- kvproxyd ----

# write_conf NODE_ID LISTEN PEER_ID PEER_ADDR [EXTRA]: writes $KVP_TMP/NODE_ID.conf
# with sockets $KVP_TMP/NODE_ID.sock and $KVP_TMP/NODE_ID.admin. The test
# networks are private namespaces: unless EXTRA configures auth, peers run
# unauthenticated on purpose (auth = "none"; kvproxyd refuses a non-loopback
# listen address without a secret otherwise).
write_conf() {
	local id=$1 listen=$2 peer=$3 peer_addr=$4 extra=${5:-}
	[[ $extra == *auth* ]] || extra="auth = \"none\";
$extra"
	cat >"$KVP_TMP/$id.conf" <<EOF
# generated by $KVP_TEST
node_id = "$id";
client_socket = "$KVP_TMP/$id.sock";
admin_socket = "$KVP_TMP/$id.admin";
listen = "$listen";
transport = "${KVP_TRANSPORT:-tcp}";
log_level = "info";
timeouts = {
	peer_ms = ${KVP_PEER_MS:-1000};
	reconnect_ms = 100;
	${KVP_TIMEOUTS_EXTRA:-}
};
$extra
peers = (
	{ node_id = "$peer"; addr = "$peer_addr"; }
);
EOF
}

sock_of() { echo "$KVP_TMP/$1.sock"; }
admin_of() { echo "$KVP_TMP/$1.admin"; }

# EAL arguments shared by every daemon of the suite (no hugepages, no shared
# config, so several primaries can run on one host). KVP_WORKERS=N (meson
# sets 2 for the *_w2 variants) gives each daemon N worker lcores, all free
# to run on any CPU of this host (the CI host has 2: the daemons' workers
# share them and back off to blocking waits when idle).
KVP_WORKERS=${KVP_WORKERS:-1}
if [[ $KVP_WORKERS -gt 1 ]]; then
	_cpus="(0-$(($(nproc) - 1)))"
	_map="0@$_cpus"
	for ((_i = 1; _i <= KVP_WORKERS; _i++)); do _map+=",$_i@$_cpus"; done
	KVP_EAL=(--lcores "$_map" --no-huge --no-shconf -m 256 --log-level=lib.eal:error)
	unset _cpus _map _i
else
	KVP_EAL=(-l "0,1" --no-huge --no-shconf -m 256 --log-level=lib.eal:error)
fi
# Extra EAL words from the environment (e.g. "-d /path/librte_mempool_ring.so"
# on a host without DPDK's plugin directory).
read -r -a KVP_EAL_EXTRA_ARR <<<"${KVP_EAL_EXTRA:-}"
KVP_EAL+=("${KVP_EAL_EXTRA_ARR[@]}")

# start_daemon NODE_ID NS: starts kvproxyd in the background (NS empty: on
# the host); its pid goes to DPID[NODE_ID], its output to $KVP_TMP/NODE_ID.log.
# KVP_EAL_DECODE / KVP_EAL_PREFILL: EAL words for decode* / prefill* daemons
# only (the benchmarks put their lcores on different CPUs, as on two hosts);
# with KVP_EAL_NO_LCORES=1 KVP_EAL's lcore words ("-l 0,1" or "--lcores
# MAP") are left out (those words name the lcores).
declare -A DPID=()
start_daemon() {
	local id=$1 ns=$2 logf="$KVP_TMP/$1.log" extra=() eal=("${KVP_EAL[@]}")
	KVP_DAEMON_LOGS+=("$logf")
	[[ $id == decode* ]] && read -r -a extra <<<"${KVP_EAL_DECODE:-}"
	[[ $id == prefill* ]] && read -r -a extra <<<"${KVP_EAL_PREFILL:-}"
	[[ ${KVP_EAL_NO_LCORES:-0} == 1 && (${eal[0]} == -l || ${eal[0]} == --lcores) ]] &&
		eal=("${eal[@]:2}")
	spawn "$ns" "$logf" - "$KVPROXYD" "${eal[@]}" "${extra[@]}" -- -c "$KVP_TMP/$id.conf"
	DPID[$id]=$SPAWNED
	log "started kvproxyd $id (pid ${DPID[$id]}${ns:+, netns $ns})"
}

daemon_alive() {
	running_pid "${DPID[$1]}"
}

# ctl NODE_ID ARGS...: kvproxyctl against NODE_ID's admin socket.
ctl() {
	local id=$1
	shift
	"$KVPROXYCTL" -s "$(admin_of "$id")" --timeout 10 "$@"
}

# wait_admin NODE_ID [SECONDS]: until 'kvproxyctl status' answers.
wait_admin() {
	local id=$1 dl
	dl=$(deadline_in "${2:-60}")
	while before "$dl"; do
		daemon_alive "$id" || fail "kvproxyd $id exited during start-up (see its log below)"
		if [[ -S $(admin_of "$id") ]] &&
			"$KVPROXYCTL" -s "$(admin_of "$id")" --timeout 2 status >/dev/null 2>&1; then
			log "kvproxyd $id answers on its admin socket"
			return 0
		fi
		sleep "$KVP_POLL"
	done
	fail "kvproxyd $id: admin socket did not answer 'status' within ${2:-60}s"
}

# peer_state NODE_ID PEER_ID: prints the state kvproxyctl peers reports,
# "up" only once every link (tcp.connections) is up, else "up (N of M links)".
peer_state() {
	local f="$KVP_TMP/peers.json"
	if ctl "$1" --json peers >"$f" 2>/dev/null; then
		json_get "$f" "(lambda p: p['state'] if p['state'] != 'up' or p.get('links_up', 1) >= p.get('links', 1) else 'up (%d of %d links)' % (p['links_up'], p['links']))(peer('$2'))" 2>/dev/null || echo "absent"
	else
		echo "no answer"
	fi
}

# wait_peer_up NODE_ID PEER_ID [SECONDS]
wait_peer_up() {
	local id=$1 peer=$2 dl st=""
	dl=$(deadline_in "${3:-60}")
	while before "$dl"; do
		daemon_alive "$id" || fail "kvproxyd $id exited while waiting for peer $peer"
		st=$(peer_state "$id" "$peer")
		if [[ $st == up ]]; then
			log "$id sees peer $peer up"
			return 0
		fi
		sleep "$KVP_POLL"
	done
	fail "$id: peer $peer not up within ${3:-60}s (last state: $st)"
}

# up_pair NS_P NS_D: start prefill0 and decode0 (configs written; namespace
# names, empty for this host's), wait for their admin sockets and both links.
up_pair() {
	start_daemon prefill0 "$1"
	start_daemon decode0 "$2"
	wait_admin prefill0
	wait_admin decode0
	wait_peer_up prefill0 decode0
	wait_peer_up decode0 prefill0
}

# zerocopy_variant ARG [EXTRA]: a test's variant argument, before
# init_test: none (CONF empty) or "zerocopy" (CONF turns tcp.zerocopy on,
# plus EXTRA config; KVP_TEST gets _zerocopy for its logs and temp dir).
zerocopy_variant() {
	# shellcheck disable=SC2034 # CONF is the calling test's
	case $1 in
	"") CONF="" ;;
	zerocopy) CONF="tcp = { zerocopy = true; }; ${2:-}" KVP_TEST=${KVP_TEST}_zerocopy ;;
	*) setup_fail "unknown variant '$1' (none or zerocopy)" ;;
	esac
}

# start_pair SUBNET: namespaces, configs, both daemons, peers up.
start_pair() {
	netns_pair "$1"
	write_conf prefill0 "$ADDR_P:7400" decode0 "$ADDR_D:7400" "${2:-}"
	write_conf decode0 "$ADDR_D:7400" prefill0 "$ADDR_P:7400" "${2:-}"
	up_pair "$NS_P" "$NS_D"
}

# loopback_pair [EXTRA]: both daemons on this host (no namespaces: the GPU
# host has no iproute2), on two free loopback ports, peers up. Another
# process could take a port before kvproxyd binds it; that shows up as a
# daemon that fails to start, not as a wrong pass.
loopback_pair() {
	local pp pd
	read -r pp pd < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
	log "loopback ports prefill0 $pp, decode0 $pd"
	write_conf prefill0 "127.0.0.1:$pp" decode0 "127.0.0.1:$pd" "${1:-}"
	write_conf decode0 "127.0.0.1:$pd" prefill0 "127.0.0.1:$pp" "${1:-}"
	up_pair "" ""
}

# stop_daemon_checked NODE_ID: TERM, and assert a clean exit (status 0, no
# sanitizer report in its log).
stop_daemon_checked() {
	local id=$1 pid=${DPID[$1]} rc=0
	daemon_alive "$id" || fail "kvproxyd $id is not running any more"
	stop_pid "$pid" 30 || rc=$?
	untrack "$pid"
	[[ $rc -eq 0 ]] || fail "kvproxyd $id exited with status $rc after SIGTERM"
	if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$KVP_TMP/$id.log"; then
		fail "kvproxyd $id: sanitizer report in its log"
	fi
	log "kvproxyd $id stopped cleanly"
}

# honest_pair TAG SIZE SEED: a decode and a prefill client (kvproxy-bench) in
# the background, prefill0 -> decode0 in $NS_P/$NS_D; sets HDEC, HPRE.
honest_pair() {
	local tag=$1 size=$2 seed=$3
	spawn "$NS_D" "$KVP_TMP/$tag.decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
		--size "$size" --seed "$seed" --key-file "$KVP_TMP/$tag.key" --timeout 240
	HDEC=$SPAWNED
	spawn "$NS_P" "$KVP_TMP/$tag.prefill.out" - "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" \
		--peer decode0 --key-file "$KVP_TMP/$tag.key" --size "$size" --seed "$seed" --wait-key 60
	HPRE=$SPAWNED
}

# honest_done TAG SIZE: both clients of honest_pair exit 0 and every byte verified.
honest_done() {
	local tag=$1 size=$2 rc=0
	wait_pid "$HPRE" 240 || rc=$?
	cat "$KVP_TMP/$tag.prefill.out" >&2
	[[ $rc -eq 0 ]] || fail "honest prefill client ($tag) exited $rc"
	rc=0
	wait_pid "$HDEC" 120 || rc=$?
	cat "$KVP_TMP/$tag.decode.out" >&2
	[[ $rc -eq 0 ]] || fail "honest decode client ($tag) exited $rc"
	grep -q "decode: verified $size bytes" "$KVP_TMP/$tag.decode.out" ||
		fail "honest decode client ($tag) did not verify $size bytes"
	log "honest pair $tag: $size bytes transferred and verified"
}

# occupy_worker0 NODE NS: with several workers (KVP_WORKERS > 1), an idle
# client on NODE takes worker 0 (clients go to the worker with the fewest),
# so the test's next client there sits on worker 1 while the peer's first
# worker sends to it: its bytes land through worker 0's links and queue
# pairs, and its landing notices cross to worker 1. Does nothing with one
# worker. release_worker0 NODE stops that client.
declare -A KVP_OCCUPIER=()
occupy_worker0() {
	[[ $KVP_WORKERS -gt 1 ]] || return 0
	spawn "$2" "$KVP_TMP/occupy.$1.out" - "$KVPROXY_BENCH" decode -s "$(sock_of "$1")" \
		--size 4096 --seed 1 --key-file "$KVP_TMP/occupy.$1.key" --timeout 900
	KVP_OCCUPIER[$1]=$SPAWNED
	wait_file "$KVP_TMP/occupy.$1.key" 60 "$SPAWNED"
	log "an idle client holds worker 0 of $1"
}
release_worker0() {
	[[ -n ${KVP_OCCUPIER[$1]:-} ]] || return 0
	stop_pid "${KVP_OCCUPIER[$1]}" 15 >/dev/null 2>&1 || true
	untrack "${KVP_OCCUPIER[$1]}"
	unset "KVP_OCCUPIER[$1]"
}

# ---- JSON checks (python3's json, no jq needed) ----
# Expressions see d (the document) and peer(NAME) (its "peers" entry for NAME).

stats_json() { ctl "$1" --json stats; }
# worker_lcores NODE: its worker lcores, comma-separated (the CPUs with -l).
worker_lcores() {
	ctl "$1" --json stats | python3 -S -c 'import json, sys; print(",".join(str(w["lcore"]) for w in json.load(sys.stdin)["workers"]))'
}

KVP_PYEVAL='
import json, sys
d = json.load(open(sys.argv[2]))
def peer(name):
    return next(p for p in d["peers"] if p.get("node_id") == name)
v = eval(sys.argv[3], {"d": d, "peer": peer})
if sys.argv[1] == "get":
    print(json.dumps(v) if isinstance(v, (dict, list)) else v)
else:
    sys.exit(0 if v else 1)
'

# json_get FILE EXPR: prints EXPR.
json_get() { python3 -S -c "$KVP_PYEVAL" get "$1" "$2"; }

# json_check FILE EXPR MESSAGE: fails the test unless EXPR is true.
json_check() {
	if ! python3 -S -c "$KVP_PYEVAL" check "$1" "$2"; then
		log "document: $(head -c 4000 "$1")"
		fail "$3 (check: $2)"
	fi
}

# wait_json NODE_ID METHOD EXPR SECONDS WHAT: until EXPR holds for the result of
# 'kvproxyctl --json METHOD' (status/stats/peers).
wait_json() {
	local id=$1 method=$2 expr=$3 secs=$4 what=$5 dl f="$KVP_TMP/wait.json"
	dl=$(deadline_in "$secs")
	while before "$dl"; do
		daemon_alive "$id" || fail "kvproxyd $id died while waiting for: $what"
		if ctl "$id" --json "$method" >"$f" 2>/dev/null &&
			python3 -S -c "$KVP_PYEVAL" check "$f" "$expr" 2>/dev/null; then
			return 0
		fi
		sleep "$KVP_POLL"
	done
	log "last $method of $id: $(head -c 4000 "$f" 2>/dev/null)"
	fail "$id: not within ${secs}s: $what"
}

# wait_file FILE SECONDS PID: until FILE exists and is non-empty (PID must stay alive).
wait_file() {
	local f=$1 dl
	dl=$(deadline_in "$2")
	while before "$dl"; do
		[[ -s $f ]] && return 0
		if [[ -n ${3:-} ]] && ! kill -0 "$3" 2>/dev/null; then
			fail "process $3 exited before writing $f"
		fi
		sleep "$KVP_POLL"
	done
	fail "$f did not appear within ${2}s"
}

# wait_pid PID SECONDS: wait for a child to exit, bounded; returns its status.
# wait_log ID TEXT SECONDS: until daemon ID's log holds TEXT (a fixed string).
wait_log() {
	local dl
	dl=$(deadline_in "$3")
	until grep -qF -- "$2" "$KVP_TMP/$1.log"; do
		before "$dl" || fail "$1's log did not say '$2' within ${3}s"
		sleep "$KVP_POLL"
	done
}

wait_pid() {
	local pid=$1 dl rc=0
	dl=$(deadline_in "$2")
	while running_pid "$pid"; do
		before "$dl" || fail "pid $pid still running after ${2}s"
		sleep "$KVP_POLL"
	done
	wait "$pid" || rc=$?
	untrack "$pid"
	return $rc
}

# ---- memory cgroups (v1 memory controller, or v2 with memory enabled) ----

# memcg_create LIMIT_BYTES: a child memory cgroup of ours with a hard limit
# (swap included where the kernel accounts it); sets MEMCG to its directory.
# Skips the test when no memory controller is available.
KVP_MEMCG=()
memcg_create() {
	local limit=$1 rel dir
	rel=$(awk -F: '$2 == "memory" { print $3 }' /proc/self/cgroup)
	if [[ -n $rel && -d /sys/fs/cgroup/memory ]]; then
		dir="/sys/fs/cgroup/memory${rel%/}/kvp-${KVP_TEST#test_}-$$"
		mkdir "$dir" || setup_fail "cannot create memory cgroup $dir"
		KVP_MEMCG+=("$dir")
		echo "$limit" >"$dir/memory.limit_in_bytes" || setup_fail "cannot set memory.limit_in_bytes"
		[[ ! -f $dir/memory.memsw.limit_in_bytes ]] || echo "$limit" >"$dir/memory.memsw.limit_in_bytes"
		MEMCG_KIND=v1
	else
		rel=$(awk -F: '$1 == "0" { print $3 }' /proc/self/cgroup)
		dir="/sys/fs/cgroup${rel%/}"
		grep -qw memory "$dir/cgroup.controllers" 2>/dev/null || skip "no memory cgroup controller (v1 or v2) here"
		echo +memory >"$dir/cgroup.subtree_control" 2>/dev/null || true
		dir="$dir/kvp-${KVP_TEST#test_}-$$"
		mkdir "$dir" || setup_fail "cannot create memory cgroup $dir"
		KVP_MEMCG+=("$dir")
		echo "$limit" >"$dir/memory.max" || setup_fail "cannot set memory.max"
		[[ ! -f $dir/memory.swap.max ]] || echo 0 >"$dir/memory.swap.max"
		MEMCG_KIND=v2
	fi
	MEMCG=$dir
	log "memory cgroup $MEMCG ($MEMCG_KIND), limit $limit bytes"
}

# memcg_ooms: OOM kills in $MEMCG so far.
memcg_ooms() {
	if [[ $MEMCG_KIND == v1 ]]; then
		awk '$1 == "oom_kill" { print $2 }' "$MEMCG/memory.oom_control"
	else
		awk '$1 == "oom_kill" { print $2 }' "$MEMCG/memory.events"
	fi
}

# memcg_peak: the most memory $MEMCG has used (bytes).
memcg_peak() {
	if [[ $MEMCG_KIND == v1 ]]; then
		cat "$MEMCG/memory.max_usage_in_bytes"
	elif [[ -f $MEMCG/memory.peak ]]; then
		cat "$MEMCG/memory.peak"
	else
		cat "$MEMCG/memory.current"
	fi
}

# start_daemon_in_memcg NODE_ID NS: start_daemon, with the daemon inside $MEMCG.
start_daemon_in_memcg() {
	local id=$1 ns=$2 logf="$KVP_TMP/$1.log"
	KVP_DAEMON_LOGS+=("$logf")
	# The shell joins the cgroup and then execs: the daemon is born inside it.
	spawn "" "$logf" - sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$MEMCG" \
		ip netns exec "$ns" "$KVPROXYD" "${KVP_EAL[@]}" -- -c "$KVP_TMP/$id.conf"
	DPID[$id]=$SPAWNED
	log "started kvproxyd $id (pid ${DPID[$id]}, netns $ns, memory cgroup)"
}
