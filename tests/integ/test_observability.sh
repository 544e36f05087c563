#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts what issue 6 ("see every transfer") promises, between two kvproxyd
# in network namespaces:
#  - phase timings: every completion's phases are >= 0 and add up to its
#    end-to-end time (client completions and the daemon's slowest table);
#    the phase histograms agree with each other; a tc tbf rate limit on the
#    veth lands in the wire phase and nowhere else;
#  - per-peer byte counters equal the bytes moved, in JSON and Prometheus;
#  - transfers lists in-flight work, cancel CLIENT USER_ID cancels it;
#  - drain finishes in-flight work and refuses new work with "shutdown";
#  - config_set of a runtime knob takes effect (config_get and behaviour),
#    of a fixed key is refused with the reason, of a bad value is refused;
#  - the Prometheus text parses with a strict parser (and promtool if present);
#  - the periodic stats file appears and SIGUSR1 rewrites it;
#  - malformed admin input of many kinds gets JSON-RPC errors and the daemon
#    keeps serving; every kvproxyctl command has --help.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

require_netns
require_bins
command -v tc >/dev/null || skip "tc (iproute2) is not installed"
PYDIR=$(cd "$(dirname "$0")/../../python" && pwd)
KVPROXY_LIB=${KVPROXY_LIB:-$(dirname "$KVPROXYD")/../lib/client/libkvproxy.so}
[[ -f $KVPROXY_LIB ]] || setup_fail "libkvproxy.so not found next to kvproxyd ($KVPROXY_LIB)"
export KVPROXY_LIB
# An ASan build's libkvproxy cannot be dlopen()ed by an uninstrumented python3:
# preload the runtime it names (no leak checks for python3 itself).
PY=(env PYTHONPATH="$PYDIR")
asan=$(grep -a -o -m1 'libasan\.so[.0-9]*' "$KVPROXY_LIB" | head -n1 || true)
if [[ -n $asan ]]; then
	PY+=(LD_PRELOAD="$asan" ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1)
fi
PY+=(python3)
init_test

# ---- start: each node writes its own stats file ----
# The rate limits below drop packets; TCP's retransmit backoff must not look
# like a dead peer (liveness is another test's subject).
KVP_PEER_MS=5000
netns_pair 61
for n in prefill0 decode0; do
	extra="stats = { file = \"$KVP_TMP/$n.prom\"; interval_ms = 200; };"
	if [[ $n == prefill0 ]]; then
		write_conf prefill0 "$ADDR_P:7400" decode0 "$ADDR_D:7400" "$extra"
	else
		write_conf decode0 "$ADDR_D:7400" prefill0 "$ADDR_P:7400" "$extra"
	fi
done
start_daemon prefill0 "$NS_P"
start_daemon decode0 "$NS_D"
wait_admin prefill0
wait_admin decode0
wait_peer_up prefill0 decode0
wait_peer_up decode0 prefill0

# A strict Prometheus text-format (0.0.4) parser: every line is a comment,
# HELP/TYPE or a sample; names and labels are well formed; a family's TYPE
# comes before its samples, once; samples of a family are contiguous; no
# series twice; histograms have increasing le bounds, cumulative buckets, a
# +Inf bucket equal to _count, and a _sum. Prints a JSON summary.
cat >"$KVP_TMP/promparse.py" <<'EOF'
import json, math, re, sys
NAME = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*')
LNAME = re.compile(r'[a-zA-Z_][a-zA-Z0-9_]*')
def die(msg, ln=None):
    sys.exit("line %s: %s" % (ln, msg) if ln else msg)
def value(s, ln):
    if s in ("+Inf", "-Inf", "NaN"):
        return float(s.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r'[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?', s):
        die("bad value %r" % s, ln)
    return float(s)
def labels(s, i, ln):
    out = {}
    assert s[i] == "{"
    i += 1
    while True:
        if s[i] == "}":
            return out, i + 1
        m = LNAME.match(s, i)
        if not m:
            die("bad label name at %r" % s[i:], ln)
        k = m.group(0); i = m.end()
        if s[i:i + 2] != '="':
            die("expected =\" after label %s" % k, ln)
        i += 2; v = ""
        while s[i] != '"':
            if s[i] == "\\":
                if s[i + 1] not in 'n"\\':
                    die("bad escape", ln)
                v += {"n": "\n", '"': '"', "\\": "\\"}[s[i + 1]]; i += 2
            elif s[i] == "\n":
                die("newline in label value", ln)
            else:
                v += s[i]; i += 1
        i += 1
        if k in out:
            die("duplicate label %s" % k, ln)
        out[k] = v
        if s[i] == ",":
            i += 1
        elif s[i] != "}":
            die("expected , or } in labels", ln)
text = open(sys.argv[1]).read()
if not text.endswith("\n"):
    die("text does not end with a newline")
types, helps, seen, series, order = {}, {}, set(), {}, []
last_family = None
def family_of(name):
    for suf in ("_bucket", "_sum", "_count"):
        if name.endswith(suf) and types.get(name[:-len(suf)]) == "histogram":
            return name[:-len(suf)]
    return name
for ln, line in enumerate(text.split("\n")[:-1], 1):
    if line == "":
        die("empty line", ln)
    if line.startswith("#"):
        p = line.split(" ", 3)
        if len(p) >= 3 and p[1] in ("HELP", "TYPE"):
            if not NAME.fullmatch(p[2]):
                die("bad metric name %r" % p[2], ln)
            if p[1] == "TYPE":
                if p[2] in types:
                    die("second TYPE for %s" % p[2], ln)
                if p[2] in seen:
                    die("TYPE for %s after its samples" % p[2], ln)
                if len(p) != 4 or p[3] not in ("counter", "gauge", "histogram", "summary", "untyped"):
                    die("bad TYPE line", ln)
                types[p[2]] = p[3]
            else:
                if p[2] in helps:
                    die("second HELP for %s" % p[2], ln)
                helps[p[2]] = p[3] if len(p) == 4 else ""
        continue
    m = NAME.match(line)
    if not m:
        die("bad sample line %r" % line, ln)
    name = m.group(0); i = m.end(); lab = {}
    if i < len(line) and line[i] == "{":
        lab, i = labels(line, i, ln)
    rest = line[i:]
    if not rest.startswith(" "):
        die("expected a space before the value", ln)
    parts = rest[1:].split(" ")
    if len(parts) not in (1, 2):
        die("bad value/timestamp", ln)
    v = value(parts[0], ln)
    fam = family_of(name)
    if fam not in types:
        die("sample %s without a TYPE" % name, ln)
    if fam != last_family:
        if fam in seen:
            die("samples of %s are not contiguous" % fam, ln)
        seen.add(fam); last_family = fam
    if types[fam] == "counter" and (v < 0 or not name.endswith("_total")):
        die("counter %s must end in _total and be >= 0" % name, ln)
    key = (name, tuple(sorted(lab.items())))
    if key in series:
        die("duplicate series %r" % (key,), ln)
    series[key] = v
    order.append((fam, name, lab, v, ln))
# Histograms.
hists = {}
for fam, name, lab, v, ln in order:
    if types[fam] != "histogram":
        continue
    base = tuple(sorted((k, x) for k, x in lab.items() if k != "le"))
    h = hists.setdefault((fam, base), {"b": [], "sum": None, "count": None})
    if name.endswith("_bucket"):
        if "le" not in lab:
            die("bucket without le", ln)
        le = value(lab["le"], ln)
        if h["b"] and le <= h["b"][-1][0]:
            die("le not increasing", ln)
        if h["b"] and v < h["b"][-1][1]:
            die("buckets not cumulative", ln)
        h["b"].append((le, v))
    elif name.endswith("_sum"):
        h["sum"] = v
    else:
        h["count"] = v
for (fam, base), h in hists.items():
    if not h["b"] or h["b"][-1][0] != math.inf:
        die("%s%s: no +Inf bucket" % (fam, base))
    if h["count"] is None or h["sum"] is None:
        die("%s%s: no _count or _sum" % (fam, base))
    if h["b"][-1][1] != h["count"]:
        die("%s%s: +Inf bucket != _count" % (fam, base))
out = {"families": len(types), "samples": len(series), "histograms": len(hists),
       "values": {"%s%s" % (k[0], json.dumps(dict(k[1]), sort_keys=True)): v
                  for k, v in series.items()}}
print(json.dumps(out))
EOF

# prom_check FILE: strict parse (and promtool when installed); summary in FILE.json.
prom_check() {
	python3 "$KVP_TMP/promparse.py" "$1" >"$1.json" ||
		{ head -c 3000 "$1" >&2; fail "$1 is not valid Prometheus text (strict parser)"; }
	if command -v promtool >/dev/null; then
		promtool check metrics <"$1" || fail "promtool check metrics rejects $1"
	fi
}
PROMVAL_PY='import json, sys
d = json.load(open(sys.argv[1]))["values"]
def v(name, **lab): return d[name + json.dumps(lab, sort_keys=True)]
'

# ---- the stats file appears and parses; SIGUSR1 rewrites it ----
wait_file "$KVP_TMP/prefill0.prom" 30 "${DPID[prefill0]}"
prom_check "$KVP_TMP/prefill0.prom"
log "periodic stats file: $(json_get "$KVP_TMP/prefill0.prom.json" 'd["families"]') families"
ctl prefill0 config_set stats.interval_ms 0 >/dev/null || fail "config_set stats.interval_ms 0 refused"
ino0=$(stat -c %i "$KVP_TMP/prefill0.prom")
# No periodic writes any more: the inode (rename of a new file) changes only on SIGUSR1.
kill -USR1 "${DPID[prefill0]}"
dl=$(deadline_in 10)
until [[ $(stat -c %i "$KVP_TMP/prefill0.prom") != "$ino0" ]]; do
	before "$dl" || fail "SIGUSR1 did not rewrite the stats file within 10 s"
	sleep "$KVP_POLL"
done
prom_check "$KVP_TMP/prefill0.prom"
daemon_alive prefill0 || fail "prefill0 died on SIGUSR1"
ls "$KVP_TMP"/.prefill0.prom.* >/dev/null 2>&1 && fail "a temporary stats file was left behind"
log "SIGUSR1 rewrote the stats file"

# ---- a verified transfer; byte counters and phase histograms ----
SIZE=$((32 << 20))
# bench_pair TAG SIZE SEG INFLIGHT [PREFILL-FLAGS...]: a verified transfer; the
# prefill client's JSON goes to $KVP_TMP/TAG.prefill.
bench_pair() {
	local tag=$1 size=$2 seg=$3 infl=$4 prc=0
	shift 4
	spawn "$NS_D" "$KVP_TMP/$tag.decode" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
		--size "$size" --seed 7 --key-file "$KVP_TMP/$tag.key" --timeout 120 \
		--min-seg "$seg" --max-seg "$seg" --segs-per-xfer 2
	local dec=$SPAWNED
	in_ns "$NS_P" timeout -k 5 150 "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" \
		--peer decode0 --key-file "$KVP_TMP/$tag.key" --size "$size" --seed 7 \
		--min-seg "$seg" --max-seg "$seg" --segs-per-xfer 2 --inflight "$infl" \
		--wait-key 30 --json "$@" >"$KVP_TMP/$tag.prefill" || prc=$?
	[[ $prc -eq 0 ]] || fail "$tag: prefill exited $prc: $(cat "$KVP_TMP/$tag.prefill")"
	wait_pid "$dec" 60 || fail "$tag: decode did not verify: $(cat "$KVP_TMP/$tag.decode")"
}
bench_pair base "$SIZE" 1048576 4
XF=$(json_get "$KVP_TMP/base.prefill" 'd["xfers"]')
stats_json prefill0 >"$KVP_TMP/p1.json"
stats_json decode0 >"$KVP_TMP/d1.json"
json_check "$KVP_TMP/p1.json" "peer('decode0')['tx_bytes'] == $SIZE and peer('decode0')['tx_xfers'] == $XF" \
	"prefill0: per-peer tx bytes/transfers != bytes/transfers moved"
json_check "$KVP_TMP/d1.json" "peer('prefill0')['rx_bytes'] == $SIZE and peer('prefill0')['rx_xfers'] == $XF" \
	"decode0: per-peer rx bytes/transfers != bytes/transfers moved"
ctl prefill0 stats --prometheus >"$KVP_TMP/p1.prom" || fail "stats --prometheus failed"
prom_check "$KVP_TMP/p1.prom"
python3 - "$KVP_TMP/p1.prom.json" "$SIZE" "$XF" <<EOF || fail "Prometheus counters or histograms disagree with what moved"
$PROMVAL_PY
size, xf = int(sys.argv[2]), int(sys.argv[3])
lab = dict(node="prefill0", peer="decode0", transport="tcp")
assert v("kvproxy_peer_tx_bytes_total", **lab) == size, "tx bytes"
assert v("kvproxy_peer_tx_transfers_total", **lab) == xf, "tx transfers"
phases = ["queue", "admit", "first_byte", "send", "wire", "deliver"]
total = v("kvproxy_send_phase_seconds_sum", phase="total", **lab)
parts = sum(v("kvproxy_send_phase_seconds_sum", phase=p, **lab) for p in phases)
for p in phases + ["total"]:
    assert v("kvproxy_send_phase_seconds_count", phase=p, **lab) == xf, "count of " + p
assert total > 0 and abs(parts - total) <= 1e-6 * xf + 1e-9 * total, (parts, total)
EOF
log "byte counters and phase histograms agree with $XF transfers of $SIZE bytes"

# ---- completions carry the phases: python client (phase_ns[0..7] of the ABI) ----
cat >"$KVP_TMP/cqe.py" <<'EOF'
import json, sys, time
import kvproxy
mode, sock, keyf, n, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), 1 << 20
with kvproxy.Client(sock) as c, kvproxy.HostBuffer(size * n) as buf, c.register(buf) as r:
    got = []
    if mode == "decode":
        open(keyf + ".tmp", "w").write(str(r.key)); __import__("os").replace(keyf + ".tmp", keyf)
        end = time.monotonic() + 60
        while len(got) < n and time.monotonic() < end:
            got += [x.phases for x in c.wait(timeout=1) if x.kind == "landed"]
    else:
        end = time.monotonic() + 30
        while not __import__("os").path.exists(keyf) and time.monotonic() < end:
            time.sleep(0.05)
        dst = int(open(keyf).read())
        for i in range(n):
            c.submit("decode0", [kvproxy.Segment(r.key, i * size, dst, i * size, size)], user_id=i)
        end = time.monotonic() + 60
        while len(got) < n and time.monotonic() < end:
            for x in c.wait(timeout=1):
                assert x.kind == "done" and x.ok, x
                got.append(x.phases)
    print(json.dumps(got))
EOF
spawn "$NS_D" "$KVP_TMP/cqe.decode" "$KVP_TMP/cqe.decode.err" "${PY[@]}" "$KVP_TMP/cqe.py" decode \
	"$(sock_of decode0)" "$KVP_TMP/cqe.key" 8
CQD=$SPAWNED
in_ns "$NS_P" timeout -k 5 90 "${PY[@]}" "$KVP_TMP/cqe.py" prefill "$(sock_of prefill0)" "$KVP_TMP/cqe.key" 8 \
	>"$KVP_TMP/cqe.prefill" || fail "python prefill client failed"
wait_pid "$CQD" 60 || fail "python decode client failed: $(cat "$KVP_TMP/cqe.decode.err")"
python3 - "$KVP_TMP/cqe.prefill" "$KVP_TMP/cqe.decode" <<'EOF' || fail "completion phases are inconsistent"
import json, sys
done, landed = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert len(done) == 8 and len(landed) == 8, (len(done), len(landed))
eps = 2e-9  # phases are whole nanoseconds, reported in seconds
for p in done:
    assert all(v >= 0 and v < 60 for v in p.values()), p
    parts = p["queue"] + p["admit"] + p["post"] + p["wire"] + p["deliver"]
    assert abs(parts - p["e2e"]) <= 5 * eps, ("sum of phases != e2e", p)
    assert abs(p["total"] - (p["e2e"] - p["queue"])) <= 2 * eps, ("total != e2e - queue", p)
    assert p["first"] <= p["post"] + eps and p["wire"] > 0 and p["e2e"] > 0, p
for p in landed:
    assert all(v >= 0 and v < 60 for v in p.values()), p
    assert abs(p["wire"] + p["deliver"] - p["total"]) <= 2 * eps, ("landed phases", p)
    assert p["queue"] == 0 and p["post"] == 0 and p["e2e"] == 0, p
EOF
log "client completions: phases >= 0, they add up to the end-to-end time (both sides)"

# ---- slowest: full breakdowns that add up ----
ctl prefill0 --json slowest >"$KVP_TMP/slow.json" || fail "slowest failed"
json_check "$KVP_TMP/slow.json" "len(d['transfers']) > 0 and d['enabled']" "slowest table is empty"
json_check "$KVP_TMP/slow.json" \
	"all(all(v >= 0 for v in t['phases'].values()) and abs(sum(t['phases'].values()) - t['total_us']) <= 0.01 + 1e-6 * t['total_us'] for t in d['transfers'])" \
	"slowest: phases must be >= 0 and add up to total_us"
json_check "$KVP_TMP/slow.json" \
	"[t['total_us'] for t in d['transfers']] == sorted([t['total_us'] for t in d['transfers']], reverse=True) and all(t['status'] == 'ok' and not t['deadline_missed'] for t in d['transfers'])" \
	"slowest: not sorted slowest first, or a failed transfer where all succeeded"
ctl prefill0 slowest --limit 3 >"$KVP_TMP/slow.txt" || fail "slowest (text) failed"
grep -q "WIRE_US" "$KVP_TMP/slow.txt" || fail "slowest text has no WIRE_US column"
log "slowest: $(json_get "$KVP_TMP/slow.json" 'len(d["transfers"])') entries, each adds up"

# hist_sums NODE: send-phase sums (seconds) by phase, as JSON.
hist_sums() {
	ctl "$1" --json stats | python3 -c 'import json, sys
d = json.load(sys.stdin)
print(json.dumps({x["phase"]: x["sum_us"] / 1e6 for x in d["latency"] if x["direction"] == "send"}))'
}

# ---- a rate limit on the veth shows up in the wire phase, not elsewhere ----
hist_sums prefill0 >"$KVP_TMP/h0.json"
ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate 100mbit burst 128kb latency 200ms ||
	setup_fail "tc tbf unavailable"
bench_pair tbf $((16 << 20)) 1048576 1
hist_sums prefill0 >"$KVP_TMP/h1.json"
python3 - "$KVP_TMP/h0.json" "$KVP_TMP/h1.json" <<'EOF' || fail "the rate limit did not land in the wire phase alone"
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
d = {k: b[k] - a.get(k, 0) for k in b}
print("phase time added under tbf (s): %s" % {k: round(v, 4) for k, v in d.items()}, file=sys.stderr)
# 16 MiB at 100 Mbit/s takes >= 1.34 s on the wire.
assert d["wire"] >= 1.0, d
assert d["wire"] >= 0.85 * d["total"], d
for p in ("queue", "admit", "deliver"):
    assert d[p] <= 0.02 * d["total"], (p, d)
EOF
log "tbf: the wire phase carries the rate limit"

# ---- transfers in flight, cancel, drain ----
# Slow link: 8 transfers of 2 MiB at 20 Mbit/s, 2 in flight, take ~7 s.
ip netns exec "$NS_P" tc qdisc change dev "$VETH_P" root tbf rate 20mbit burst 64kb latency 400ms ||
	setup_fail "tc tbf change failed"
spawn "$NS_D" "$KVP_TMP/dr.decode" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
	--size $((16 << 20)) --seed 9 --key-file "$KVP_TMP/dr.key" --timeout 120 \
	--min-seg 2097152 --max-seg 2097152 --segs-per-xfer 1 --stop-file "$KVP_TMP/dr.stop"
DRD=$SPAWNED
spawn "$NS_P" "$KVP_TMP/dr.prefill" "$KVP_TMP/dr.prefill.err" "$KVPROXY_BENCH" prefill \
	-s "$(sock_of prefill0)" --peer decode0 --key-file "$KVP_TMP/dr.key" --size $((16 << 20)) \
	--seed 9 --min-seg 2097152 --max-seg 2097152 --segs-per-xfer 1 --inflight 2 --wait-key 30 --json
DRP=$SPAWNED
wait_json prefill0 transfers 'd["count"] == 2' 30 "two transfers in flight"
ctl prefill0 --json transfers >"$KVP_TMP/tr.json" || fail "transfers failed"
json_check "$KVP_TMP/tr.json" \
	"all(t['peer'] == 'decode0' and t['bytes'] == 2097152 and t['age_ms'] >= 0 and t['phase'] in ('waiting', 'admitted', 'sending', 'wire', 'acked') for t in d['transfers'])" \
	"transfers: wrong peer, bytes, age or phase"
ctl prefill0 transfers | grep -q "^ID .*PHASE" || fail "transfers text has no table header"
# Cancel the later of the two (it waits behind the first on the slow link).
read -r CL UID_C < <(json_get "$KVP_TMP/tr.json" \
	'"%d %d" % max((t["user_id"], t["client"]) for t in d["transfers"])[::-1]')
ctl prefill0 cancel "$CL" "$UID_C" >/dev/null || fail "kvproxyctl cancel $CL $UID_C failed"
log "cancelled transfer $UID_C of client $CL"
ctl prefill0 --json drain --no-wait >"$KVP_TMP/drain0.json" || fail "drain --no-wait failed"
json_check "$KVP_TMP/drain0.json" "d['draining'] and d['inflight'] >= 1" \
	"drain: expected in-flight work when the drain started"
json_check "$(ctl prefill0 --json status >"$KVP_TMP/st.json"; echo "$KVP_TMP/st.json")" \
	"d['draining']" "status does not say draining"
# New work while draining is refused with "shutdown", at once.
nrc=0
in_ns "$NS_P" timeout -k 5 60 "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KVP_TMP/dr.key" --size $((4 << 20)) --seed 9 --min-seg 2097152 --max-seg 2097152 \
	--segs-per-xfer 1 --inflight 2 --json >"$KVP_TMP/dr.new" 2>/dev/null || nrc=$?
[[ $nrc -eq 1 ]] || fail "a prefill while draining exited $nrc, expected 1 (all refused)"
json_check "$KVP_TMP/dr.new" "d['status']['shutdown'] == d['xfers'] == 2" \
	"new submissions while draining must all end with status shutdown"
# drain (waiting) returns once the in-flight work has finished.
ctl prefill0 --json drain --wait 60 >"$KVP_TMP/drain1.json" || fail "drain did not finish in-flight work"
json_check "$KVP_TMP/drain1.json" "d['idle'] and d['inflight'] == 0 and d['refused'] >= 2" \
	"drain: not idle, or refusals not counted"
prc=0
wait_pid "$DRP" 60 || prc=$?
[[ $prc -eq 1 ]] || fail "the drained prefill exited $prc, expected 1 (some refused)"
json_check "$KVP_TMP/dr.prefill" \
	"d['status']['ok'] >= 1 and d['status']['canceled'] == 1 and d['status']['ok'] + d['status']['canceled'] + d['status']['shutdown'] == 8" \
	"drained prefill: in-flight transfers must finish ok (one canceled), the rest refused"
touch "$KVP_TMP/dr.stop"
wait_pid "$DRD" 60 || fail "decode client of the drained run found bad data: $(cat "$KVP_TMP/dr.decode")"
REFUSED=$(json_get "$KVP_TMP/drain1.json" 'd["refused"]')
json_check "$(stats_json prefill0 >"$KVP_TMP/p2.json"; echo "$KVP_TMP/p2.json")" \
	"d['completions']['shutdown'] == $REFUSED == d['totals']['drain_refused'] and d['completions']['canceled'] == 1" \
	"completions.shutdown / drain_refused / canceled do not match"
log "drain: in-flight work finished ($(json_get "$KVP_TMP/dr.prefill" 'd["status"]["ok"]') ok), $REFUSED refused with shutdown"
ctl prefill0 undrain >/dev/null || fail "undrain failed"
json_check "$(ctl prefill0 --json status >"$KVP_TMP/st.json"; echo "$KVP_TMP/st.json")" \
	"not d['draining']" "still draining after undrain"

# ---- config_set: runtime knobs take effect, fixed keys are refused ----
# timeouts.default_ms: 2 MiB at 20 Mbit/s takes 0.8 s; with 200 ms every transfer times out.
ctl prefill0 config_set timeouts.default_ms 200 >/dev/null || fail "config_set timeouts.default_ms refused"
json_check "$(ctl prefill0 --json config_get timeouts.default_ms >"$KVP_TMP/cg.json"; echo "$KVP_TMP/cg.json")" \
	"d['value'] == 200 and d['runtime'] and d['min'] == 1" "config_get does not show the new default_ms"
spawn "$NS_D" "$KVP_TMP/to.decode" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
	--size $((4 << 20)) --seed 11 --key-file "$KVP_TMP/to.key" --timeout 120 \
	--min-seg 2097152 --max-seg 2097152 --segs-per-xfer 1 --stop-file "$KVP_TMP/to.stop"
TOD=$SPAWNED
trc=0
in_ns "$NS_P" timeout -k 5 60 "$KVPROXY_BENCH" prefill -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KVP_TMP/to.key" --size $((4 << 20)) --seed 11 --min-seg 2097152 --max-seg 2097152 \
	--segs-per-xfer 1 --inflight 1 --wait-key 30 --json >"$KVP_TMP/to.json" 2>"$KVP_TMP/to.err" || trc=$?
[[ $trc -eq 1 ]] || fail "prefill with default_ms 200 exited $trc, expected 1: $(cat "$KVP_TMP/to.err")"
json_check "$KVP_TMP/to.json" "d['status']['timeout'] == 2" "the new default deadline did not apply"
touch "$KVP_TMP/to.stop"
wait_pid "$TOD" 60 || fail "decode client of the timed-out run found bad data: $(cat "$KVP_TMP/to.decode")"
grep -q "missed its deadline" "$KVP_TMP/prefill0.log" || fail "no deadline-miss breakdown in the log"
grep "missed its deadline" "$KVP_TMP/prefill0.log" | head -1 | grep -q "wire" ||
	fail "the deadline-miss log line has no phase breakdown"
ctl prefill0 config_set timeouts.default_ms 30000 >/dev/null || fail "restoring default_ms failed"
ip netns exec "$NS_P" tc qdisc del dev "$VETH_P" root
# stats.enabled: off freezes the histograms, on again resumes them.
ctl prefill0 config_set stats.enabled false >/dev/null || fail "config_set stats.enabled false"
c0=$(ctl prefill0 --json stats | python3 -c 'import json,sys; print(sum(x["count"] for x in json.load(sys.stdin)["latency"] if x["phase"] == "total"))')
bench_pair off $((4 << 20)) 1048576 2
c1=$(ctl prefill0 --json stats | python3 -c 'import json,sys; print(sum(x["count"] for x in json.load(sys.stdin)["latency"] if x["phase"] == "total"))')
[[ $c0 -eq "$c1" ]] || fail "histograms grew with stats.enabled false ($c0 -> $c1)"
ctl prefill0 config_set stats.enabled true >/dev/null || fail "config_set stats.enabled true"
bench_pair on $((4 << 20)) 1048576 2
c2=$(ctl prefill0 --json stats | python3 -c 'import json,sys; print(sum(x["count"] for x in json.load(sys.stdin)["latency"] if x["phase"] == "total"))')
[[ $c2 -gt "$c1" ]] || fail "histograms did not resume with stats.enabled true ($c1 -> $c2)"
# log_level through both commands.
ctl prefill0 log_level debug >/dev/null || fail "log_level debug"
[[ $(json_get "$(ctl prefill0 --json config_get log_level >"$KVP_TMP/cg.json"; echo "$KVP_TMP/cg.json")" 'd["value"]') == debug ]] ||
	fail "config_get log_level does not show debug"
ctl prefill0 config_set log_level info >/dev/null || fail "config_set log_level info"
# Refusals: fixed key (with the reason), bad values, unknown key; nothing changes.
expect_refused() { # WHAT PATTERN ARGS...
	local what=$1 pat=$2 rc=0
	shift 2
	ctl prefill0 config_set "$@" >"$KVP_TMP/ref.out" 2>"$KVP_TMP/ref.err" || rc=$?
	[[ $rc -eq 1 ]] || fail "config_set $* ($what): exit $rc, expected 1"
	grep -q -- "$pat" "$KVP_TMP/ref.err" || fail "config_set $* ($what): error '$(cat "$KVP_TMP/ref.err")' lacks '$pat'"
}
expect_refused fixed "error -32001: limits.max_inflight cannot change at run time: tables and rings" limits.max_inflight 8
expect_refused fixed "error -32001: listen cannot change at run time" listen 0.0.0.0:9
expect_refused range "expected an integer in \[1, 3600000\]" timeouts.default_ms 0
expect_refused range "expected an integer" timeouts.admission_ms 12x
expect_refused type "expected true or false" poll.busy maybe
expect_refused level "expected a log level" log_level loud
expect_refused unknown "unknown key 'no.such'" no.such 1
expect_refused path "error -32001: stats.file: at run time only a file in" stats.file relative.prom
expect_refused path "error -32001: stats.file: at run time only a file in" stats.file /etc/shadow
ctl prefill0 --json config_get limits.max_inflight >"$KVP_TMP/cg.json" || fail "config_get limits.max_inflight"
json_check "$KVP_TMP/cg.json" "d['value'] == 256 and not d['runtime'] and 'start' in d['fixed']" \
	"a refused config_set changed limits.max_inflight, or config_get lacks the reason"
ctl prefill0 config_get >"$KVP_TMP/cg.txt" || fail "config_get (all) failed"
grep -Eq '^timeouts.default_ms +30000 +true' "$KVP_TMP/cg.txt" || fail "config_get table lacks timeouts.default_ms 30000 true"
grep -Eq '^auth.secret +- +false' "$KVP_TMP/cg.txt" || fail "config_get: auth.secret must show empty and fixed"
# poll.busy on and off: the worker keeps serving either way.
ctl prefill0 config_set poll.busy true >/dev/null || fail "config_set poll.busy true"
bench_pair busy $((4 << 20)) 1048576 2
ctl prefill0 config_set poll.busy false >/dev/null || fail "config_set poll.busy false"
log "config_set: runtime knobs took effect; fixed keys and bad values refused"

# ---- the rest of the CLI ----
ctl prefill0 watch --count 2 --interval 0.2 >"$KVP_TMP/watch.txt" || fail "watch failed"
[[ $(grep -c '^decode0 ' "$KVP_TMP/watch.txt") -eq 2 ]] || fail "watch did not show decode0 twice: $(cat "$KVP_TMP/watch.txt")"
grep -q "staging" "$KVP_TMP/watch.txt" || fail "watch does not show the staging pool"
ctl prefill0 --json doctor >"$KVP_TMP/doc.json" || fail "doctor failed"
json_check "$KVP_TMP/doc.json" \
	"d['transport'] == 'tcp' and d['gpus'] == [] and any(c['check'] == 'gpu' and 'refused' in c['detail'] for c in d['checks']) and any(x['role'] == 'decode0' and x['iface'] == '$VETH_P' and x['pci'] == 'virtual' for x in d['network']) and all(c['result'] in ('ok', 'warning') for c in d['checks'])" \
	"doctor: wrong transport, GPU line or route to decode0"
for cmd in status stats peers transfers slowest cancel drain undrain config_get config_set log_level doctor watch call; do
	"$KVPROXYCTL" "$cmd" --help >"$KVP_TMP/help.txt" 2>&1 || fail "kvproxyctl $cmd --help exited non-zero"
	grep -q "^Usage: .* $cmd" "$KVP_TMP/help.txt" || fail "kvproxyctl $cmd --help prints no usage"
done
rc=0
ctl prefill0 cancel 1 >/dev/null 2>&1 || rc=$?
[[ $rc -eq 2 ]] || fail "cancel with one argument: exit $rc, expected 2 (usage)"

# ---- malformed admin input: JSON-RPC errors, connection and daemon unharmed ----
python3 - "$(admin_of prefill0)" <<'EOF' || fail "malformed admin input was not answered as expected"
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(10)
f = s.makefile("rwb")
def ask(raw):
    f.write(raw + b"\n"); f.flush()
    line = f.readline()
    assert line.endswith(b"\n"), ("no reply to", raw)
    return json.loads(line)
def rpc(method, params=None, rid=1):
    req = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        req["params"] = params
    return ask(json.dumps(req).encode())
cases = [
    (b"{", -32700), (b"not json", -32700), (b"\xff\xfe", -32700), (b'{"a":1,"a":2}', -32700),
    (b"[]", -32600), (b"42", -32600), (b'"s"', -32600), (b"null", -32600),
    (b'{"id":1,"method":"status"}', -32600), (b'{"jsonrpc":"1.0","id":1,"method":"status"}', -32600),
    (b'{"jsonrpc":"2.0","id":1,"method":5}', -32600),
    (b'{"jsonrpc":"2.0","id":1,"method":"status","params":"x"}', -32600),
    (b'{"jsonrpc":"2.0","id":1,"method":"nope"}', -32601),
    (b'{"jsonrpc":"2.0","id":1,"method":"status","params":[1]}', -32602),
    (b"[" * 5000 + b"]" * 5000, -32700),
]
for raw, code in cases:
    r = ask(raw)
    assert r.get("jsonrpc") == "2.0" and r["error"]["code"] == code, (raw[:40], r)
bad = [
    ("status", {"x": 1}), ("stats", {"format": 5}), ("stats", {"format": "xml"}),
    ("stats", {"format": "json", "extra": 1}), ("transfers", {"limit": 0}),
    ("transfers", {"limit": "9"}), ("slowest", {"limit": -1}), ("slowest", {"limit": 10**12}),
    ("cancel", {}), ("cancel", {"client": -1, "user_id": 1}), ("cancel", {"client": 1}),
    ("cancel", {"client": 2**40, "user_id": 1}), ("drain", {"now": True}), ("undrain", {"x": 0}),
    ("config_get", {"key": 5}), ("config_get", {"key": "nope"}), ("config_get", {"k": "x"}),
    ("config_set", {"key": "log_level"}), ("config_set", {"key": "log_level", "value": None}),
    ("config_set", {"key": "log_level", "value": [1]}), ("config_set", {"key": "poll.idle_us", "value": -5}),
    ("config_set", {"key": "poll.idle_us", "value": 1.5}), ("config_set", {"key": "x" * 5000, "value": 1}),
    ("log_level", {"level": 3}), ("log_level", {"level": "chatty"}), ("doctor", {"deep": True}),
    ("peers", {"all": 1}),
]
for m, p in bad:
    r = rpc(m, p)
    assert "error" in r and r["error"]["code"] == -32602 and r["id"] == 1, (m, p, r)
    assert isinstance(r["error"]["message"], str) and r["error"]["message"], r
r = rpc("config_set", {"key": "limits.max_clients", "value": 2})
assert r["error"]["code"] == -32001 and "cannot change" in r["error"]["message"], r
# A notification (no id) runs but is not answered: the next reply is for id 2.
f.write(b'{"jsonrpc":"2.0","method":"status"}\n'); f.flush()
r = rpc("status", rid=2)
assert r["id"] == 2 and r["result"]["node_id"] == "prefill0" and not r["result"]["draining"], r
r = rpc("config_get", {"key": "poll.idle_us"})
assert r["result"]["value"] == 20, r
print("malformed admin input: %d cases answered" % (len(cases) + len(bad) + 1), file=sys.stderr)
EOF
daemon_alive prefill0 || fail "prefill0 died on malformed admin input"
bench_pair after $((4 << 20)) 1048576 2
log "the daemon still moves data after the malformed input"

prom_check "$KVP_TMP/prefill0.prom"
stop_daemon_checked prefill0
stop_daemon_checked decode0
