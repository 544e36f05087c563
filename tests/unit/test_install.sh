#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# meson install lays out what a newcomer needs: the man pages kvproxyd(8)
# and kvproxyctl(8), the systemd unit (with the EAL flags of a host without
# hugepages, pointing at the installed kvproxyd), the sample configuration,
# and the client headers, which a C++ compiler takes. Installs into a
# temporary DESTDIR (meson install --destdir), never onto this system.
# Usage: test_install.sh MESON BUILD_DIR
# Exit: 0 pass, 1 fail, 77 skip (with the reason), 99 setup broke.
set -euo pipefail

meson=$1 build=$2
dest=$(mktemp -d /tmp/kvp-install.XXXXXX)
trap 'rm -rf "$dest"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$meson" install -C "$build" --no-rebuild --destdir "$dest" --quiet >"$dest.log" 2>&1 ||
	{ cat "$dest.log" >&2; rm -f "$dest.log"; echo "meson install failed" >&2; exit 99; }
rm -f "$dest.log"
prefix=$("$meson" introspect "$build" --buildoptions |
	python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
root="$dest$prefix"
echo "installed under $root:"
(cd "$dest" && find . -type f | sort | sed 's/^/  /')

for page in kvproxyd kvproxyctl; do
	f="$root/share/man/man8/$page.8"
	[[ -s $f ]] || fail "no man page $f"
	# groff's own warnings (-ww) on the installed page, and the NAME it declares.
	if command -v groff >/dev/null; then
		w=$(groff -man -Tutf8 -ww -z "$f" 2>&1) || true
		[[ -z $w ]] || fail "$page.8: groff warns: $w"
	fi
	grep -q "^$page \\\\- " "$f" || fail "$page.8 has no NAME line for $page"
	grep -q "@[A-Z]*@" "$f" && fail "$page.8 has unsubstituted @VARIABLES@"
done
grep -qF -- '\-\-check' "$root/share/man/man8/kvproxyd.8" || fail "kvproxyd.8 does not document --check"

unit=$(find "$dest" -name kvproxyd.service)
[[ -n $unit ]] || fail "no kvproxyd.service installed"
case $unit in
*/lib/systemd/system/kvproxyd.service) ;;
*) fail "kvproxyd.service at $unit, not in a systemd unit directory" ;;
esac
grep -q '^ExecStart=.*--no-huge --no-shconf' "$unit" || fail "the unit's ExecStart lacks --no-huge --no-shconf"
exe=$(sed -n 's/^ExecStart=\([^ ]*\) .*/\1/p' "$unit")
[[ $exe == "$prefix/bin/kvproxyd" && -x $dest$exe ]] || fail "the unit starts '$exe', not the installed kvproxyd"
grep -q '^ExecStartPre=.*kvproxyd --check -c ' "$unit" || fail "the unit does not validate the configuration first"
grep -q '@[A-Z]*@' "$unit" && fail "the unit has unsubstituted @VARIABLES@"
if command -v systemd-analyze >/dev/null; then
	# Syntax only: the paths it names exist under DESTDIR, not on this system.
	out=$(systemd-analyze verify --man=no "$unit" 2>&1 | grep -v -e 'not executable' -e 'No such file' \
		-e 'Failed to prepare filename' -e 'Command .* is not executable' -e 'Unit configuration has fatal error' || true)
	[[ -z $out ]] || echo "note: systemd-analyze verify: $out"
fi

sample="$root/share/kvproxy/kvproxy.conf"
[[ -s $sample ]] || fail "no sample configuration at $sample"
"$dest$prefix/bin/kvproxyd" --check -c "$sample" || fail "the installed kvproxyd rejects the installed sample configuration"

for h in kvproxy.h kvp_rings.h; do
	[[ -s $root/include/$h ]] || fail "no $h installed"
done
if command -v c++ >/dev/null; then
	printf '#include <kvproxy.h>\nint main() { return kvp_max_segments(nullptr); }\n' >"$dest/t.cpp"
	c++ -std=c++17 -Wall -Wextra -Werror -I"$root/include" -c "$dest/t.cpp" -o "$dest/t.o" ||
		fail "the installed kvproxy.h does not compile as C++17"
fi
echo "PASS: man pages, unit, sample configuration and headers installed"
