#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The admin and client sockets under abuse (issue 7), one case per argument:
#   bounds   (admin socket, timeouts.admin_ms = 1 s, admin_idle_ms = 3 s) a
#            slow-loris client (a partial line, a byte at a time) is cut off
#            within the bound, an idle connection after the idle bound, one
#            that keeps asking is not; a client that never reads its replies
#            is cut off within the bound; a flood of connections beyond the
#            limit is refused with an error line; a line over the limit is
#            refused; kvproxyctl status answers throughout and an honest
#            transfer on the same node verifies every byte; each cut is
#            counted by reason in stats and Prometheus.
#   access   both sockets are mode 0660 with the configured group (an unknown
#            group is a FILE:LINE config error); members (primary or
#            supplementary group) use both, others cannot connect; where the
#            file mode would let another user in, the daemon's SO_PEERCRED
#            check refuses it, logs it and counts it; HELLO ring sizes above
#            limits.sq_entries/cq_entries are refused with the reason.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

CASE=${1:-bounds}
KVP_TEST=test_admin_${CASE}

require_netns
require_bins
init_test

# ---- bounds ----

case_bounds() {
	local bound=1000 idle=3000
	KVP_TIMEOUTS_EXTRA="admin_ms = $bound; admin_idle_ms = $idle;"
	start_pair 81
	# Slow the link so that the honest transfer is still moving while the abuse runs.
	ip netns exec "$NS_P" tc qdisc add dev "$VETH_P" root tbf rate 400mbit burst 256kb latency 50ms 2>/dev/null ||
		log "no tbf here: the honest transfer may end before the abuse does"
	local size=536870912
	honest_pair during "$size" 17
	wait_json prefill0 stats "peer('decode0')['tx_bytes'] > 0" 60 "honest transfer moving"

	python3 - "$(admin_of prefill0)" "$KVPROXYCTL" "$bound" "$idle" <<'EOF' || fail "admin bounds (see above)"
import json, os, select, socket, subprocess, sys, threading, time

path, ctl, bound, idle = sys.argv[1], sys.argv[2], int(sys.argv[3]) / 1e3, int(sys.argv[4]) / 1e3
SLACK = 2.0  # the daemon checks its bounds every 10-100 ms; the machine may be busy
CONNS = 16   # KVP_ADMIN_CONNS
failures = []


def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


def req(i, method="status", params=None):
    return json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params or {}}).encode() + b"\n"


def closed_after(s, t0, limit, trickle=None):
    """Seconds from t0 until the daemon closed s (EOF or reset); None if not by t0 + limit."""
    s.setblocking(False)
    nxt = time.monotonic()
    while time.monotonic() < t0 + limit:
        if trickle is not None and time.monotonic() >= nxt:
            try:
                s.send(trickle)
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - t0
            nxt += 0.2
        r, _, _ = select.select([s], [], [], 0.05)
        if r:
            try:
                if s.recv(65536) == b"":
                    return time.monotonic() - t0
            except ConnectionResetError:
                return time.monotonic() - t0
    return None


def reader_gone(s, t0, limit):
    """Seconds until the daemon hung up on s, without reading anything from it."""
    p = select.poll()
    p.register(s, select.POLLRDHUP)
    while time.monotonic() < t0 + limit:
        if p.poll(50):
            return time.monotonic() - t0
    return None


class Prober(threading.Thread):
    """kvproxyctl status in a loop: every call must answer, and quickly."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.calls, self.errors, self.worst = 0, [], 0.0

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            r = subprocess.run([ctl, "-s", path, "--timeout", "5", "--json", "status"],
                               capture_output=True, text=True)
            dt = time.monotonic() - t
            self.calls += 1
            self.worst = max(self.worst, dt)
            if r.returncode != 0 or json.loads(r.stdout or "{}").get("node_id") != "prefill0":
                self.errors.append("exit %d: %s" % (r.returncode, r.stderr.strip()))
            self.stop.wait(0.1)

    def done(self, what):
        self.stop.set()
        self.join()
        if self.errors or self.calls == 0:
            failures.append("%s: kvproxyctl status failed meanwhile: %s" % (what, self.errors[:3]))
        else:
            print("ok    %-34s kvproxyctl status answered %d times meanwhile (slowest %.0f ms)"
                  % (what, self.calls, self.worst * 1e3))


def expect_cut(what, took, bound, lo):
    """Closed no earlier than lo and within bound + SLACK."""
    if took is None:
        failures.append("%s: still open after %.1f s (bound %.1f s)" % (what, bound + SLACK, bound))
    elif took < lo:
        failures.append("%s: closed after %.2f s, before its bound %.2f s" % (what, took, bound))
    else:
        print("ok    %-34s closed after %.2f s (bound %.2f s)" % (what, took, bound))


# Slow-loris: a partial request line, then one more byte every 0.2 s, never a newline.
probe = Prober()
probe.start()
s = conn()
t0 = time.monotonic()
s.send(b'{"jsonrpc":"2.0","id":1,"method":"sta')
expect_cut("slow-loris (a byte every 0.2 s)", closed_after(s, t0, bound + SLACK, b"t"), bound, bound * 0.9)
s.close()
probe.done("slow-loris")

# Idle: connects and says nothing.
s = conn()
t0 = time.monotonic()
expect_cut("idle connection", closed_after(s, t0, idle + SLACK), idle, idle * 0.9)
s.close()

# A connection that keeps asking is not idle, whatever its age.
s = conn()
t0, n = time.monotonic(), 0
while time.monotonic() < t0 + idle + 1.0:
    s.send(req(100 + n))
    line = b""
    while not line.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        line += chunk
    if not line or json.loads(line).get("id") != 100 + n:
        failures.append("busy connection: cut or wrong reply after %.1f s" % (time.monotonic() - t0))
        break
    n += 1
    time.sleep(idle / 6)
else:
    print("ok    %-34s %d requests over %.1f s, still open" % ("busy connection", n, time.monotonic() - t0))
s.close()

# A client that asks for large replies and never reads them.
probe = Prober()
probe.start()
s = conn()
s.sendall(b"".join(req(200 + i, "stats", {"format": "prometheus"}) for i in range(64)))
t0 = time.monotonic()
# Its clock starts when a reply stalls, a little after t0: no lower bound to check.
expect_cut("reader that never reads", reader_gone(s, t0, bound + SLACK), bound, 0)
s.close()
probe.done("reader that never reads")

# Flood: every slot taken, then more connections; the extra ones get an error line.
# First let the daemon see the earlier connections go (kvproxyctl's last one may linger).
t0 = time.monotonic()
while time.monotonic() < t0 + 10:
    q = conn()
    q.sendall(req(299, "stats"))
    line = b""
    while not line.endswith(b"\n"):
        line += q.recv(1 << 20)
    q.close()
    if json.loads(line)["result"]["admin"]["connections"] == 1:
        break
    time.sleep(0.05)
held = [conn() for _ in range(CONNS)]
for h in held:  # each answers, so each really holds a slot
    h.send(req(300))
    if b'"result"' not in h.recv(65536):
        failures.append("flood: a connection within the limit was not served")
refused, t0 = 0, time.monotonic()
for i in range(3 * CONNS):
    x = conn()
    try:
        x.send(req(400 + i))
    except (BrokenPipeError, ConnectionResetError):
        pass
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = x.recv(4096)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    x.close()
    if b"too many admin connections" in data:
        refused += 1
dt = time.monotonic() - t0
if refused != 3 * CONNS:
    failures.append("flood: %d of %d extra connections got the error line" % (refused, 3 * CONNS))
else:
    print("ok    %-34s %d extra connections refused with an error line in %.0f ms" % ("flood", refused, dt * 1e3))
for h in held:
    h.close()
fresh = subprocess.run([ctl, "-s", path, "--timeout", "5", "status"], capture_output=True, text=True)
if fresh.returncode != 0:
    failures.append("flood: kvproxyctl status fails after the flood ended: %s" % fresh.stderr.strip())

# A request line over the limit (64 KiB) without a newline.
s = conn()
try:
    s.sendall(b'{"jsonrpc":"2.0","id":9,"method":"status","params":{"pad":"' + b"a" * (1 << 20))
except (BrokenPipeError, ConnectionResetError):
    pass
data = b""
try:
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
except ConnectionResetError:
    pass
s.close()
if b"request line too long" not in data:
    failures.append("over-long line: no 'request line too long' error before the close (%r)" % data[:200])
else:
    print("ok    %-34s error line, then closed" % "over-long line (1 MiB)")

for f in failures:
    print("FAIL: " + f, file=sys.stderr)
sys.exit(1 if failures else 0)
EOF
	daemon_alive prefill0 || fail "prefill0 died under the admin abuse"
	stats_json prefill0 >"$KVP_TMP/s.json"
	log "prefill0 admin counters: $(json_get "$KVP_TMP/s.json" 'd["admin"]'); honest transfer: $(json_get "$KVP_TMP/s.json" "peer('decode0')['tx_bytes']") of $size bytes sent when the abuse ended"
	json_check "$KVP_TMP/s.json" 'd["admin"]["slow"] >= 2 and d["admin"]["idle"] >= 1 and d["admin"]["refused"] >= 48 and d["admin"]["too_long"] >= 1' \
		"admin cut-offs not counted by reason"
	ctl prefill0 stats --prometheus >"$KVP_TMP/p.prom" || fail "stats --prometheus failed"
	local r
	for r in slow idle too_long; do
		grep -Eq "^kvproxy_admin_cut_total\{node=\"prefill0\",reason=\"$r\"\} [1-9]" "$KVP_TMP/p.prom" ||
			fail "Prometheus: no kvproxy_admin_cut_total for reason $r"
	done
	grep -Eq '^kvproxy_admin_refused_total\{node="prefill0"\} [1-9]' "$KVP_TMP/p.prom" ||
		fail "Prometheus: kvproxy_admin_refused_total missing or 0"
	grep -q "admin connection closed: a request line was not completed within timeouts.admin_ms" \
		"$KVP_TMP/prefill0.log" || fail "the slow-loris cut-off was not logged"

	honest_done during "$size"
	stop_daemon_checked prefill0
	stop_daemon_checked decode0
}

# ---- access ----

# as_user GROUPS CMD...: CMD as uid/gid 65534 (nobody) with supplementary GROUPS
# ("" for none), or with primary group GROUPS when it starts with "primary:".
as_user() {
	local g=$1
	shift
	case $g in
	"") setpriv --reuid=65534 --regid=65534 --clear-groups "$@" ;;
	primary:*) setpriv --reuid=65534 --regid="${g#primary:}" --clear-groups "$@" ;;
	*) setpriv --reuid=65534 --regid=65534 --groups="$g" "$@" ;;
	esac
}

case_access() {
	command -v setpriv >/dev/null || skip "setpriv (util-linux) is needed to act as another user"
	setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null ||
		skip "cannot run as uid 65534 here (setpriv --reuid failed)"
	# A python3 that uid 65534 may run (a per-user install under /root is not one).
	local py=""
	for py in /usr/bin/python3 /usr/local/bin/python3 ""; do
		[[ -n $py ]] && as_user "" "$py" -c pass 2>/dev/null && break
	done
	[[ -n $py ]] || skip "no python3 that uid 65534 can run"
	# A group other users may be in: "users" where it exists, else a bare number.
	local grp gid
	if getent group users >/dev/null; then
		grp=users
		gid=$(getent group users | cut -d: -f3)
	else
		grp=4242
		gid=4242
	fi

	# An unknown group is an error at its line, and nothing is created.
	local conf="$KVP_TMP/badgroup.conf" rc=0
	printf 'node_id = "g0";\nclient_socket = "%s/g0.sock";\nadmin_socket = "%s/g0.admin";\nadmin_group = "no-such-group-kvp";\n' \
		"$KVP_TMP" "$KVP_TMP" >"$conf"
	timeout -k 5 60 "$KVPROXYD" "${KVP_EAL[@]}" -- -c "$conf" >"$KVP_TMP/badgroup.out" 2>&1 || rc=$?
	[[ $rc -ne 0 && $rc -lt 124 ]] || fail "kvproxyd with an unknown admin_group exited $rc"
	grep -q "$conf:4: admin_group: no such group: 'no-such-group-kvp'" "$KVP_TMP/badgroup.out" ||
		{ cat "$KVP_TMP/badgroup.out" >&2; fail "unknown group: no '$conf:4: admin_group: ...' error"; }
	[[ ! -e $KVP_TMP/g0.sock && ! -e $KVP_TMP/g0.admin ]] || fail "sockets created despite the bad group"
	log "unknown group refused: $(grep -m1 -- "$conf:" "$KVP_TMP/badgroup.out")"

	start_pair 82 "client_group = \"$grp\"; admin_group = \"$grp\";"
	local s
	for s in "$(sock_of prefill0)" "$(admin_of prefill0)"; do
		[[ $(stat -c '%a %g' "$s") == "660 $gid" ]] ||
			fail "$s is $(stat -c '%a %U:%G' "$s"), expected mode 660 and group $grp ($gid)"
	done
	log "client and admin sockets: mode 660, group $grp"
	# The regression guard for status's field names (uptime_s, peers_up).
	ctl prefill0 --json status >"$KVP_TMP/st.json"
	json_check "$KVP_TMP/st.json" '"uptime_s" in d and d["peers_up"] == 1 and "gpu_region_bytes" in d' \
		"status lacks uptime_s / peers_up / gpu_region_bytes"

	# Other users reach the sockets only through the group: the temp dir must let them pass.
	chmod 0711 "$KVP_TMP"
	cat >"$KVP_TMP/peer.py" <<'EOF'
import array, json, os, socket, struct, sys

def connect(path):
    """A connected socket, or None where the file's mode keeps us out."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(path)
    except PermissionError:
        s.close()
        return None
    return s

def hello(path, sq, cq):
    s = connect(path)
    if s is None:
        return "eacces", ""
    data, fds = b"", []
    try:
        # magic, HELLO, KVP_ABI_VERSION (2), seq 1
        s.sendall(struct.pack("<HHIQIIi", 0x4b56, 1, 2, 1, sq, cq, os.getpid()).ljust(256, b"\0"))
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before our HELLO was read: the reply may be waiting all the same
    try:
        while len(data) < 256:
            msg, anc, _, _ = s.recvmsg(256 - len(data), socket.CMSG_SPACE(4 * 4))
            for lvl, typ, cd in anc:
                if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    fds += array.array("i", cd[: len(cd) // 4 * 4])
            if not msg:
                break
            data += msg
    except (BrokenPipeError, ConnectionResetError):
        pass
    for fd in fds:
        os.close(fd)
    s.close()
    if len(data) < 256:
        return "closed", ""
    err = struct.unpack_from("<i", data, 4)[0]
    if err:
        return "error", "%d %s" % (err, data[96:].split(b"\0")[0].decode())
    return "ok", "client %#x" % struct.unpack_from("<I", data, 24)[0]

def admin(path):
    s = connect(path)
    if s is None:
        return "eacces", ""
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"status"}\n')
    line = b""
    while not line.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            return "closed", ""
        line += chunk
    return ("ok", "") if "result" in json.loads(line) else ("error", line.decode())

kind, path = sys.argv[1], sys.argv[2]
if kind == "hello":
    r = hello(path, int(sys.argv[3]) if len(sys.argv) > 3 else 0, int(sys.argv[4]) if len(sys.argv) > 4 else 0)
else:
    r = admin(path)
print("%s %s" % r)
EOF
	chmod 0644 "$KVP_TMP/peer.py"
	local csock asock
	csock=$(sock_of prefill0)
	asock=$(admin_of prefill0)
	# expect WANT WHO CMD...: run the probe, its first word must be WANT.
	expect() {
		local want=$1 who=$2 out
		shift 2
		out=$("$@" 2>&1) || fail "$who: probe failed: $out"
		[[ ${out%% *} == "$want" ]] || fail "$who: expected '$want', got '$out'"
		log "$who: $out"
	}
	expect ok "root, client socket" "$py" "$KVP_TMP/peer.py" hello "$csock"
	expect ok "supplementary member, client socket" as_user "$gid" "$py" "$KVP_TMP/peer.py" hello "$csock"
	expect ok "primary member, client socket" as_user "primary:$gid" "$py" "$KVP_TMP/peer.py" hello "$csock"
	expect ok "member, admin socket" as_user "$gid" "$py" "$KVP_TMP/peer.py" admin "$asock"
	expect eacces "non-member, client socket" as_user "" "$py" "$KVP_TMP/peer.py" hello "$csock"
	expect eacces "non-member, admin socket" as_user "" "$py" "$KVP_TMP/peer.py" admin "$asock"

	# Loosen the file mode: the kernel lets the non-member connect, the daemon must not.
	stats_json prefill0 >"$KVP_TMP/a0.json"
	local before
	before=$(json_get "$KVP_TMP/a0.json" 'd["clients_refused"]["credentials"]')
	chmod 0666 "$csock"
	# Refused with the reason (a HELLO reply with -EPERM), then closed.
	expect error "non-member through a 0666 client socket" as_user "" "$py" "$KVP_TMP/peer.py" hello "$csock"
	as_user "" "$py" "$KVP_TMP/peer.py" hello "$csock" | grep -q -- "^error -1 kvproxyd prefill0 does not serve uid 65534" ||
		fail "the refused non-member did not get the reason"
	expect ok "member through a 0666 client socket" as_user "$gid" "$py" "$KVP_TMP/peer.py" hello "$csock"
	chmod 0660 "$csock"
	wait_json prefill0 stats "d['clients_refused']['credentials'] == $before + 2" 10 \
		"the refused peer counted at each attempt (clients_refused.credentials)"
	ctl prefill0 stats --prometheus >"$KVP_TMP/a.prom"
	grep -Eq "^kvproxy_clients_refused_total\{node=\"prefill0\",reason=\"credentials\"\} $((before + 2))\$" "$KVP_TMP/a.prom" ||
		fail "Prometheus: kvproxy_clients_refused_total{reason=\"credentials\"} is not $((before + 2))"
	grep -q "client connection refused: pid [0-9]* uid 65534 gid 65534 is not uid 0" "$KVP_TMP/prefill0.log" ||
		fail "the refused peer was not logged with its credentials"

	# Ring sizes: up to the configured limits (4096 / 1024 by default), powers of two.
	expect ok "HELLO sq 4096 cq 1024" "$py" "$KVP_TMP/peer.py" hello "$csock" 4096 1024
	expect ok "HELLO sq 64 cq 16" "$py" "$KVP_TMP/peer.py" hello "$csock" 64 16
	expect error "HELLO sq 8192" "$py" "$KVP_TMP/peer.py" hello "$csock" 8192 0
	expect error "HELLO cq 65536" "$py" "$KVP_TMP/peer.py" hello "$csock" 0 65536
	expect error "HELLO sq 100" "$py" "$KVP_TMP/peer.py" hello "$csock" 100 0
	"$py" "$KVP_TMP/peer.py" hello "$csock" 8192 0 | grep -q -- "-22 .*limits.sq_entries (4096)" ||
		fail "the ring-size refusal does not give the limit"
	# Each refused HELLO is a failed handshake, counted (issue 16).
	wait_json prefill0 stats "d['totals']['client_handshake_failures'] >= 4" 10 \
		"refused HELLOs counted (totals.client_handshake_failures)"
	ctl prefill0 stats --prometheus | grep -Eq '^kvproxy_client_handshake_failures_total\{node="prefill0"\} ([4-9]|[1-9][0-9]+)$' ||
		fail "Prometheus: kvproxy_client_handshake_failures_total below 4"
	wait_json prefill0 status 'd["clients"] == 0' 30 "probe clients gone"
	stop_daemon_checked prefill0
	stop_daemon_checked decode0
}

case $CASE in
bounds) case_bounds ;;
access) case_access ;;
*) setup_fail "unknown case '$CASE'" ;;
esac
