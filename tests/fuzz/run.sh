#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Build the fuzz targets with clang + libFuzzer (ASan + UBSan) in their own
# build dir, fuzz each for a bounded time from its seed corpus, and replay
# every seed and regression input. Prints one line per target (executions)
# and a summary; exits 1 if any target crashed or a replay failed, 77 if
# clang/libFuzzer is not available here.
#
# Usage: tests/fuzz/run.sh [--seconds N] [--builddir DIR] [--replay-only] [TARGET...]
#   --seconds N     fuzzing time per target (default 30, or $KVP_FUZZ_SECONDS)
#   --builddir DIR  clang build dir (default build-fuzz-clang, under the repo)
#   --replay-only   only replay corpus/ and regress/ (no fuzzing)
#   TARGET          admin client_ctrl config ring wire_hello wire_rx (default: all)
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 99
root=$PWD

usage() {
	sed -n '3,15p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

secs=${KVP_FUZZ_SECONDS:-30}
builddir=build-fuzz-clang
replay_only=0
targets=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--seconds) [[ $# -ge 2 ]] || usage; secs=$2; shift ;;
	--builddir) [[ $# -ge 2 ]] || usage; builddir=$2; shift ;;
	--replay-only) replay_only=1 ;;
	-h | --help) usage ;;
	-*) usage ;;
	*) targets+=("$1") ;;
	esac
	shift
done
[[ ${#targets[@]} -gt 0 ]] || targets=(admin client_ctrl config ring wire_hello wire_rx)

# clang with libFuzzer (Debian: clang, libclang-rt-*-dev come with it).
if ! command -v clang >/dev/null; then
	echo "SKIP: clang is not installed (apt-get install clang)"
	exit 77
fi
probe=$(mktemp -d) || exit 99
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' >"$probe/p.c"
if ! clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>"$probe/err"; then
	cat "$probe/err"
	rm -rf "$probe"
	echo "SKIP: clang cannot link -fsanitize=fuzzer here"
	exit 77
fi
rm -rf "$probe"

# The libraries get coverage instrumentation (fuzzer-no-link) and both
# sanitizers; warnings stay warnings here (the gcc builds enforce -Werror).
if [[ ! -f $builddir/build.ninja ]]; then
	echo "==== configure $builddir (clang, libFuzzer, ASan+UBSan)"
	if ! CC=clang meson setup "$builddir" -Dbuildtype=debugoptimized -Dwerror=false \
		-Db_sanitize=address,undefined -Db_lundef=false \
		-Dc_args=-fsanitize=fuzzer-no-link </dev/null; then
		echo "fuzz: meson setup failed"
		exit 1
	fi
fi
echo "==== build the fuzz targets"
if ! ninja -C "$builddir" fuzz-targets </dev/null; then
	echo "fuzz: build failed (is subdir('fuzz') in tests/meson.build?)"
	exit 1
fi

failed=()
lines=()
for t in "${targets[@]}"; do
	exe=$root/$builddir/tests/fuzz/fuzz_$t
	if [[ ! -x $exe ]]; then
		failed+=("$t: no such target")
		continue
	fi
	if [[ $replay_only -eq 0 ]]; then
		echo "==== fuzz $t for ${secs}s"
		out=$(bash tests/fuzz/run_one.sh "$exe" "$t" "$root/tests/fuzz" fuzz "$secs")
		rc=$?
		echo "$out" | tail -n 1
		[[ $rc -eq 0 ]] || { echo "$out" | tail -n 90; failed+=("$t: crash while fuzzing"); }
		lines+=("$(echo "$out" | tail -n 1)")
	fi
	echo "==== replay $t"
	out=$(bash tests/fuzz/run_one.sh "$exe" "$t" "$root/tests/fuzz" replay)
	rc=$?
	echo "$out" | tail -n 1
	[[ $rc -eq 0 ]] || { echo "$out" | tail -n 70; failed+=("$t: replay failed"); }
	lines+=("$(echo "$out" | tail -n 1)")
done

echo "==== summary"
printf '%s\n' "${lines[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
	printf 'FAILED: %s\n' "${failed[@]}"
	exit 1
fi
echo "fuzz: all targets ran without a crash"
