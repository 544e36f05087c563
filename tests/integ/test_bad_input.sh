#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Asserts: bad transfer descriptors each end with the right status while a
# good one still lands; bad admin requests get the right JSON-RPC error (or a
# disconnect for an over-long line) and the daemon keeps serving; bad configs
# make kvproxyd exit non-zero with "FILE:LINE: ..." and create no sockets.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

require_netns
require_bins
init_test

# ---- bad configuration: checked first, no namespaces needed ----

# bad_conf NAME LINE BODY: kvproxyd must refuse BODY, naming NAME.conf:LINE
# (LINE "any" for a syntax error, whose line libconfig may place after it).
bad_conf() {
	local name=$1 line=$2 body=$3 conf="$KVP_TMP/bad-$1.conf" rc=0 pat
	printf '%s\n' "$body" >"$conf"
	timeout -k 5 60 "$KVPROXYD" "${KVP_EAL[@]}" -- -c "$conf" \
		>"$KVP_TMP/bad-$name.out" 2>"$KVP_TMP/bad-$name.err" || rc=$?
	[[ $rc -ne 0 ]] || fail "config '$name': kvproxyd exited 0"
	[[ $rc -ne 124 && $rc -ne 137 ]] || fail "config '$name': kvproxyd still running after 60s"
	[[ $rc -lt 128 ]] || fail "config '$name': kvproxyd died of signal $((rc - 128))"
	if [[ $line == any ]]; then pat="$conf:[1-9][0-9]*: "; else pat="$conf:$line: "; fi
	if ! grep -q -- "$pat" "$KVP_TMP/bad-$name.err"; then
		cat "$KVP_TMP/bad-$name.err" >&2
		fail "config '$name': stderr has no '$pat...' line"
	fi
	[[ ! -e $KVP_TMP/bad.sock && ! -e $KVP_TMP/bad.admin ]] ||
		fail "config '$name': kvproxyd created its sockets anyway"
	log "config '$name' refused: $(grep -m1 -- "$conf:" "$KVP_TMP/bad-$name.err")"
}

GOOD_HEAD="node_id = \"bad0\";
client_socket = \"$KVP_TMP/bad.sock\";
admin_socket = \"$KVP_TMP/bad.admin\";
listen = \"127.0.0.1:7499\";"

# Controls: the same head alone, and the shipped sample, are accepted (so the
# refusals below are about the one bad line each).
printf '%s\n' "$GOOD_HEAD" >"$KVP_TMP/good.conf"
for conf in "$KVP_TMP/good.conf" "$(dirname "$0")/../../conf/kvproxy.conf"; do
	timeout -k 5 60 "$KVPROXYD" "${KVP_EAL[@]}" -- -c "$conf" --check >"$KVP_TMP/good.out" 2>&1 ||
		{ cat "$KVP_TMP/good.out" >&2; fail "valid config $conf refused by --check"; }
done
[[ ! -e $KVP_TMP/bad.sock && ! -e $KVP_TMP/bad.admin ]] || fail "--check created the sockets"
log "valid configs accepted by --check"

bad_conf unknown-key 5 "$GOOD_HEAD
no_such_key = 1;"
bad_conf unknown-nested 7 "$GOOD_HEAD
limits = {
	max_clients = 4;
	no_such_limit = 2;
};"
bad_conf wrong-type 5 "$GOOD_HEAD
limits = { max_clients = \"many\"; };"
bad_conf out-of-range 6 "$GOOD_HEAD
timeouts = {
	peer_ms = 0;
};"
bad_conf bad-transport 5 "$GOOD_HEAD
transport = \"carrier-pigeon\";"
bad_conf syntax any "$GOOD_HEAD
limits = { max_clients = 4 ;
peers = ("
rc=0
timeout -k 5 60 "$KVPROXYD" "${KVP_EAL[@]}" -- -c "$KVP_TMP/bad-missing-file.conf" \
	>/dev/null 2>"$KVP_TMP/missing.err" || rc=$?
[[ $rc -ne 0 && $rc -lt 124 ]] || fail "missing config file: kvproxyd exited $rc"
grep -q -- "$KVP_TMP/bad-missing-file.conf" "$KVP_TMP/missing.err" ||
	fail "missing config file: stderr does not name the file"

# ---- bad descriptors ----

start_pair 12
KEY="$KVP_TMP/decode.key"
SEED=$RANDOM
# The bad tool's last case is a good transfer: transfer 0 of the plan, which
# this decode client verifies.
spawn "$NS_D" "$KVP_TMP/decode.out" - "$KVPROXY_BENCH" decode -s "$(sock_of decode0)" \
	--size 1m --seed "$SEED" --key-file "$KEY" --expect-xfers 1 --timeout 120
DEC=$SPAWNED
rc=0
in_ns "$NS_P" timeout -k 5 300 "$KVPROXY_BENCH" bad -s "$(sock_of prefill0)" --peer decode0 \
	--key-file "$KEY" --size 1m --seed "$SEED" --timeout 20 >"$KVP_TMP/bad.out" 2>&1 || rc=$?
cat "$KVP_TMP/bad.out" >&2
[[ $rc -eq 0 ]] || fail "kvproxy-bench bad exited $rc"
grep -q '^FAIL' "$KVP_TMP/bad.out" && fail "kvproxy-bench bad reported failing cases"
grep -Eq '^bad: 0 of [1-9][0-9]* cases failed' "$KVP_TMP/bad.out" || fail "kvproxy-bench bad: no summary"
rc=0
wait_pid "$DEC" 60 || rc=$?
cat "$KVP_TMP/decode.out" >&2
[[ $rc -eq 0 ]] || fail "decode client did not verify the good transfer (exit $rc)"

# Failures were counted by cause, and only the expected causes.
stats_json prefill0 >"$KVP_TMP/p.stats"
json_check "$KVP_TMP/p.stats" 'd["completions"]["invalid"] >= 5 and d["completions"]["remote"] >= 1 and d["completions"]["no-peer"] >= 1 and d["completions"]["ok"] >= 1' \
	"prefill0: completions by cause do not show the bad cases"
json_check "$KVP_TMP/p.stats" 'all(d["completions"][k] == 0 for k in ("no-buffers", "timeout", "peer", "canceled", "shutdown"))' \
	"prefill0: unexpected failure causes"

# ---- bad admin requests ----

python3 - "$(admin_of prefill0)" <<'EOF' || fail "admin protocol checks failed"
import json, socket, sys, time

path = sys.argv[1]
TIMEOUT = 10.0
failures = []


def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    s.connect(path)
    return s


class Conn:
    def __init__(self):
        self.s = connect()
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def reply(self):
        """One reply line parsed as JSON; None if the daemon closed the connection."""
        while b"\n" not in self.buf:
            try:
                chunk = self.s.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return None
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        self.s.close()


def status_ok(c, rid):
    try:
        c.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": "status", "params": {}}).encode() + b"\n")
    except (BrokenPipeError, ConnectionResetError):
        return None
    r = c.reply()
    if r is None:
        return None
    return r.get("id") == rid and isinstance(r.get("result"), dict) and r["result"].get("node_id") == "prefill0"


def check(name, payload, code, want_id="any"):
    c = Conn()
    c.send(payload)
    r = c.reply()
    if r is None:
        failures.append("%s: connection closed without an error reply" % name)
        return
    err = r.get("error")
    if r.get("jsonrpc") != "2.0" or not isinstance(err, dict) or "result" in r:
        failures.append("%s: not a JSON-RPC error reply: %r" % (name, r))
    elif err.get("code") not in (code if isinstance(code, tuple) else (code,)):
        failures.append("%s: error code %r, expected %r (%r)" % (name, err.get("code"), code, err))
    elif not isinstance(err.get("message"), str) or not err["message"]:
        failures.append("%s: error without a message: %r" % (name, err))
    elif want_id != "any" and r.get("id") != want_id:
        failures.append("%s: reply id %r, expected %r" % (name, r.get("id"), want_id))
    else:
        print("ok    %-28s -> %d %s" % (name, err["code"], err["message"]))
    same = status_ok(c, 900)
    if same is None:
        print("note  %-28s daemon closed the connection after the error" % name)
    elif not same:
        failures.append("%s: the same connection no longer answers status" % name)
    c.close()
    fresh = Conn()
    if not status_ok(fresh, 901):
        failures.append("%s: a new connection does not answer status" % name)
    fresh.close()


def req(**kw):
    return json.dumps(dict({"jsonrpc": "2.0"}, **kw)).encode() + b"\n"


check("malformed JSON", b'{"jsonrpc": "2.0", "id": 1, "method": "stat\n', -32700, None)
check("not JSON at all", b"hello kvproxy\n", -32700, None)
check("non-object (number)", b"42\n", -32600, None)
check("non-object (string)", b'"status"\n', -32600, None)
check("missing method", req(id=3, params={}), -32600, 3)
check("method not a string", req(id=4, method=7, params={}), -32600, 4)
check("wrong jsonrpc version", b'{"jsonrpc":"1.0","id":5,"method":"status","params":{}}\n', -32600, 5)
check("unknown method", req(id=6, method="no_such_method", params={}), -32601, 6)
check("params wrong type (string)", req(id=7, method="stats", params="prometheus"), (-32602, -32600), 7)
check("params field wrong type", req(id=8, method="stats", params={"format": 42}), -32602, 8)
check("params field bad value", req(id=9, method="stats", params={"format": "xml"}), -32602, 9)

# A slow client holding a half-written request must not block anyone else.
slow = Conn()
slow.send(b'{"jsonrpc": "2.0", "id": 10, "meth')
other = Conn()
if not status_ok(other, 902):
    failures.append("half-written request on another connection blocks the admin socket")
else:
    print("ok    %-28s -> others still served" % "half-written request")
other.close()
slow.close()

# An over-long line (1 MiB, no newline): an error reply or a disconnect, and
# the daemon keeps serving new connections.
big = Conn()
outcome = None
try:
    big.send(b'{"jsonrpc":"2.0","id":11,"method":"status","params":{"pad":"' + b"a" * (1 << 20))
    r = big.reply()
    if r is None:
        outcome = "disconnected"
    elif isinstance(r.get("error"), dict):
        outcome = "error %r" % r["error"].get("code")
    else:
        failures.append("over-long line: got a non-error reply %r" % r)
except (BrokenPipeError, ConnectionResetError):
    outcome = "disconnected"
except socket.timeout:
    failures.append("over-long line: no error and no disconnect within %ss" % TIMEOUT)
big.close()
if outcome:
    print("ok    %-28s -> %s" % ("over-long line (1 MiB)", outcome))
fresh = Conn()
if not status_ok(fresh, 903):
    failures.append("over-long line: a new connection does not answer status")
fresh.close()

# Several requests in one write are answered in order on the same connection.
c = Conn()
c.send(req(id=20, method="status", params={}) + req(id=21, method="no_such_method", params={}) + req(id=22, method="peers", params={}))
ids = []
for _ in range(3):
    r = c.reply()
    ids.append(None if r is None else r.get("id"))
if ids != [20, 21, 22]:
    failures.append("pipelined requests: reply ids %r, expected [20, 21, 22]" % ids)
else:
    print("ok    %-28s -> replies in order" % "three requests, one write")
c.close()

for f in failures:
    print("FAIL: admin: " + f, file=sys.stderr)
sys.exit(1 if failures else 0)
EOF

daemon_alive prefill0 || fail "prefill0 died during the admin checks"
# kvproxyctl maps a JSON-RPC error to exit 1 with "error CODE: MESSAGE" on stderr.
rc=0
ctl prefill0 call no_such_method >/dev/null 2>"$KVP_TMP/ctl.err" || rc=$?
[[ $rc -eq 1 ]] || fail "kvproxyctl call no_such_method exited $rc, expected 1"
grep -q '^error -32601: ' "$KVP_TMP/ctl.err" || fail "kvproxyctl did not print 'error -32601: ...'"
# And an unreachable socket to exit 3.
rc=0
"$KVPROXYCTL" -s "$KVP_TMP/nobody.admin" status 2>/dev/null || rc=$?
[[ $rc -eq 3 ]] || fail "kvproxyctl against a missing socket exited $rc, expected 3"

wait_json prefill0 status 'd["clients"] == 0 and d["regions"] == 0' 30 "clients gone after bad run"
stop_daemon_checked prefill0
stop_daemon_checked decode0
