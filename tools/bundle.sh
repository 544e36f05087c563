#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copy kvproxy's binaries and every shared library they need beyond glibc
# (DPDK, liburing, libconfig, jansson, verbs, OpenSSL; DPDK's mempool ring
# driver too) into DEST, for a host that has none of those packages (the
# binaries are built for baseline x86-64). The build-tree layout is kept, so
# the $ORIGIN rpaths still find libkvproxy. The benchmarks' network tools
# (iproute2's ip and nstat, iperf3; GPU hosts, often containers, may have
# none) go into DEST/bin as wrappers, their libraries in DEST/tools, where
# they shadow nothing else of the target's. On the target:
#   export LD_LIBRARY_PATH=DEST/libs KVP_EAL_EXTRA="-d DEST/libs/librte_mempool_ring.so.23"
#   DEST/build/app/kvproxyd -l 0,1 --no-huge --no-shconf $KVP_EAL_EXTRA -- -c CONF
#   PATH=DEST/bin:$PATH tools/bench/latency.sh DEST/build ...
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 DEST [BUILD_DIR]" >&2; exit 2; }
DEST=$1
B=$(cd "${2:-$(dirname "$0")/../build}" && pwd)
BINS=(app/kvproxyd tools/kvproxyctl/kvproxyctl tools/bench/kvproxy-bench lib/client/libkvproxy.so)
[[ -x $B/tests/gpu/gpu_client ]] && BINS+=(tests/gpu/gpu_client)
# The benchmarks' own tools, where built (tools/bench/*.sh run them).
for f in tools/bench/kvp-stage-copy-bench tools/bench/kvp-tcp-stream tools/bench/kvp-latency-bench; do
	[[ -x $B/$f ]] && BINS+=("$f")
done
# copy_libs DIR: the libraries in the ldd output on stdin, beyond glibc and this build's own.
copy_libs() {
	awk '$3 ~ /^\// { print $3 }' | sort -u |
		grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux-x86-64)\.so' | grep -v "^$B" |
		while read -r lib; do cp -L "$lib" "$1/"; done
}
mkdir -p "$DEST/libs"
for f in "${BINS[@]}"; do
	mkdir -p "$DEST/build/$(dirname "$f")"
	cp "$B/$f" "$DEST/build/$f"
done
ring=$(find /usr/lib/x86_64-linux-gnu/dpdk -name 'librte_mempool_ring.so.*' -type f | head -n 1)
{
	for f in "${BINS[@]}"; do ldd "$B/$f"; done
	[[ -z $ring ]] || ldd "$ring"
} | copy_libs "$DEST/libs"
[[ -z $ring ]] || cp -L "$ring" "$DEST/libs/librte_mempool_ring.so.23"
# bundle_tool NAME: NAME into DEST/tools, its libraries beside it, and a
# wrapper in DEST/bin. The loader's --library-path, not LD_LIBRARY_PATH:
# what `ip netns exec` starts must not inherit these libraries.
bundle_tool() {
	local path
	path=$(command -v "$1") || { echo "bundle: no $1 here, left out" >&2; return 0; }
	mkdir -p "$DEST/bin" "$DEST/tools"
	cp -L "$path" "$DEST/tools/$1"
	ldd "$path" | copy_libs "$DEST/tools"
	# shellcheck disable=SC2016 # expanded when the wrapper runs
	printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")/../tools\nexec /lib64/ld-linux-x86-64.so.2 --library-path "$d" "$d/%s" "$@"\n' "$1" >"$DEST/bin/$1"
	chmod +x "$DEST/bin/$1"
}
for t in ip nstat iperf3; do bundle_tool "$t"; done
echo "bundle in $DEST: $(find "$DEST" -type f | wc -l) files, $(du -sh "$DEST" | cut -f1)"
