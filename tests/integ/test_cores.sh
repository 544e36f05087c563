#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts lcore placement from the configuration: cores = "auto" puts the
# lcores on device-local CPUs within the process's affinity, or, where the
# devices have none (veth here), on allowed CPUs, and says so in doctor;
# with workers = 2 it places two workers on CPUs of their own; cores =
# "MAIN,WORKER" pins them there; EAL lcore arguments win over both; a
# malformed value is a configuration error naming the key, and more
# workers than the lcores allow are refused with the reason.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

require_root "sched affinity of the daemon's threads"
require_bins
command -v taskset >/dev/null || skip "taskset (util-linux) is not installed"
NCPU=$(nproc --all)
[[ $NCPU -ge 2 ]] || skip "needs two CPUs"
init_test

# EAL arguments without lcores (KVP_EAL's "-l 0,1" would decide them).
EAL_NO_L=(--no-huge --no-shconf -m 256 --log-level=lib.eal:error "${KVP_EAL_EXTRA_ARR[@]}")

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# conf CORES [EXTRA]: prefill0's config with that cores value (a peer that is never up).
conf() {
	write_conf prefill0 "127.0.0.1:$PORT" decode0 "127.0.0.1:9" "cores = \"$1\"; ${2:-}"
}

# start CPUS [EAL...]: kvproxyd under taskset CPUS; PID set.
start() {
	local cpus=$1
	shift
	spawn "" "$KVP_TMP/prefill0.log" - taskset -c "$cpus" "$KVPROXYD" "$@" -- -c "$KVP_TMP/prefill0.conf"
	PID=$SPAWNED
	DPID[prefill0]=$PID
	KVP_DAEMON_LOGS+=("$KVP_TMP/prefill0.log")
	wait_admin prefill0 30
}

# allowed NAME: Cpus_allowed_list of the daemon's thread NAME.
allowed() {
	local t
	for t in /proc/"$PID"/task/*; do
		if [[ $(cat "$t/comm") == "$1" ]]; then
			awk '/^Cpus_allowed_list/ { print $2 }' "$t/status"
			return
		fi
	done
	echo "none"
}

stop() { stop_daemon_checked prefill0; }

# 1. auto, process restricted to the last CPU: both lcores there.
LAST=$((NCPU - 1))
conf auto
start "$LAST" "${EAL_NO_L[@]}"
[[ $(allowed rte-worker-1) == "$LAST" ]] || fail "auto: worker thread allowed on '$(allowed rte-worker-1)', expected CPU $LAST"
[[ $(allowed kvproxyd) == "$LAST" ]] || fail "auto: main thread allowed on '$(allowed kvproxyd)', expected CPU $LAST"
ctl prefill0 --json doctor >"$KVP_TMP/doctor.json"
json_check "$KVP_TMP/doctor.json" "d['cores'].startswith('auto: worker on CPU $LAST') and any(c['check'] == 'cores' for c in d['checks'])" \
	"doctor does not say where auto put the lcores"
log "auto: $(json_get "$KVP_TMP/doctor.json" "d['cores']")"
stop

# 2. explicit MAIN,WORKER.
conf "$LAST,0"
start "0-$LAST" "${EAL_NO_L[@]}"
[[ $(allowed rte-worker-1) == 0 ]] || fail "cores = \"$LAST,0\": worker thread on '$(allowed rte-worker-1)'"
[[ $(allowed kvproxyd) == "$LAST" ]] || fail "cores = \"$LAST,0\": main thread on '$(allowed kvproxyd)'"
log "configured: worker on CPU 0, main on CPU $LAST"
stop

# 3. the EAL's own -l wins.
conf auto
start "0-$LAST" "${KVP_EAL[@]}"
ctl prefill0 --json doctor >"$KVP_TMP/doctor.json"
json_check "$KVP_TMP/doctor.json" "d['cores'] == 'EAL arguments'" "-l did not take precedence over cores = \"auto\""
[[ $(allowed rte-worker-1) == 1 ]] || fail "-l 0,1: worker thread on '$(allowed rte-worker-1)'"
stop

# 4. malformed values are configuration errors.
for bad in banana "1," "1,2,3" "-1,2" " 1,2"; do
	conf "$bad"
	rc=0
	"$KVPROXYD" "${KVP_EAL[@]}" -- -c "$KVP_TMP/prefill0.conf" --check >"$KVP_TMP/check.out" 2>&1 || rc=$?
	[[ $rc -eq 1 ]] || fail "cores = \"$bad\": exit $rc, expected 1"
	grep -q 'prefill0.conf:[0-9]*: cores: expected "auto"' "$KVP_TMP/check.out" ||
		fail "cores = \"$bad\": no FILE:LINE error naming the key: $(cat "$KVP_TMP/check.out")"
done
log "malformed values refused with FILE:LINE"

# 5. auto with workers = 2: two worker lcores, each on a CPU of its own.
conf auto "workers = 2;"
start "0-1" "${EAL_NO_L[@]}"
w1=$(allowed rte-worker-1) w2=$(allowed rte-worker-2)
[[ $w1 == 0 && $w2 == 1 ]] || fail "auto, workers = 2: worker threads on '$w1' and '$w2', expected CPUs 0 and 1"
ctl prefill0 --json doctor >"$KVP_TMP/doctor.json"
json_check "$KVP_TMP/doctor.json" "d['cores'].startswith('auto: 2 workers on CPUs 0,1')" \
	"doctor does not say where auto put the two workers"
wait_json prefill0 stats "len(d['workers']) == 2" 10 "two workers in stats"
log "auto, workers = 2: $(json_get "$KVP_TMP/doctor.json" "d['cores']")"
stop

# 6. workers beyond what MAIN,WORKER names, or what the EAL was given, are refused.
conf "1,0" "workers = 2;"
rc=0
"$KVPROXYD" -- -c "$KVP_TMP/prefill0.conf" --check >"$KVP_TMP/check.out" 2>&1 || rc=$?
[[ $rc -eq 1 ]] && grep -q 'prefill0.conf:[0-9]*: workers = 2: cores = "1,0" names one worker CPU' "$KVP_TMP/check.out" ||
	fail "workers = 2 with cores = \"1,0\": exit $rc, $(cat "$KVP_TMP/check.out")"
conf "" "workers = 2;"
rc=0
timeout -k 5 60 "$KVPROXYD" "${KVP_EAL[@]}" -- -c "$KVP_TMP/prefill0.conf" >"$KVP_TMP/w.out" 2>&1 || rc=$?
[[ $rc -eq 1 ]] && grep -q 'workers = 2 but the EAL has 1 worker lcore' "$KVP_TMP/w.out" ||
	fail "workers = 2 with -l 0,1: exit $rc, $(tail -3 "$KVP_TMP/w.out")"
log "workers beyond the lcores refused with the reason"
log "PASS"
