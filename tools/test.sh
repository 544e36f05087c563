#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Build kvproxy twice — plain (build/) and with address+undefined sanitizers
# (build-san/) — and run the unit, integ, fuzz-replay and rdma (Soft-RoCE in
# a QEMU VM, tools/rdma-vm.sh) suites in each; then
# the libFuzzer runs (tests/fuzz/run.sh) and a short soak. Prints skipped
# tests with their reason, and as the last line "N passed, N failed, N skipped".
# Exits non-zero if anything failed (a build failure counts as a failure).
#
# Usage (as root): ./tools/test.sh [--no-deps] [--no-san] [--builddir DIR] [--suite NAME]...
#   --no-deps       do not check/install Debian packages
#   --no-san        only the plain build
#   --builddir DIR  build in DIR and DIR-san (default: build, build-san)
#   --suite NAME    run these meson suites (in every build) instead of the defaults
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1

usage() {
	echo "usage: $0 [--no-deps] [--no-san] [--builddir DIR] [--suite NAME]..." >&2
	exit 2
}

deps=1
san=1
builddir=build
suites=()
while [[ $# -gt 0 ]]; do
	case $1 in
	--no-deps) deps=0 ;;
	--no-san) san=0 ;;
	--builddir | --suite)
		[[ $# -ge 2 ]] || usage
		if [[ $1 == --suite ]]; then suites+=("$2"); else builddir=$2; fi
		shift
		;;
	-h | --help)
		sed -n '3,12p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*) usage ;;
	esac
	shift
done
# Default: every suite in both builds; the RDMA transport is new enough that
# its VM tests earn the sanitizers' ~10 minutes.
san_suites=()
fuzz=0
if [[ ${#suites[@]} -eq 0 ]]; then
	suites=(unit integ fuzz rdma)
	san_suites=(unit integ fuzz rdma)
	fuzz=1 # and the libFuzzer runs (tests/fuzz/run.sh), bounded
fi
builds=("$builddir")
[[ $san -eq 0 ]] || builds+=("$builddir-san")

if [[ $deps -eq 1 ]]; then
	./tools/deps.sh || { echo "dependency installation failed"; echo "0 passed, 1 failed"; exit 1; }
fi
if [[ $(id -u) -ne 0 ]]; then
	echo "note: not root: the integ suite will skip (it needs network namespaces)"
fi

setup_opts() {
	case $1 in
	*-san) echo "-Db_sanitize=address,undefined -Db_lundef=false" ;;
	esac
}

# Sanitized binaries stop at the first report, with a stack trace.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:detect_leaks=1:symbolize=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:symbolize=1"

# suite_args_for BUILD: the --suite options for that build.
suite_args_for() {
	local s list=("${suites[@]}")
	if [[ $1 == *-san && ${#san_suites[@]} -gt 0 ]]; then
		list=("${san_suites[@]}")
	fi
	for s in "${list[@]}"; do
		printf -- '--suite\n%s\n' "$s"
	done
}

build_failures=()
ran=()
for b in "${builds[@]}"; do
	echo "==== $b: configure and build"
	# shellcheck disable=SC2046 # the options are words on purpose
	if [[ ! -f $b/build.ninja ]] && ! meson setup "$b" $(setup_opts "$b") </dev/null; then
		build_failures+=("$b: meson setup failed")
		continue
	fi
	if ! ninja -C "$b" </dev/null; then
		build_failures+=("$b: build failed")
		continue
	fi
	mapfile -t suite_args < <(suite_args_for "$b")
	echo "==== $b: meson test ${suite_args[*]}"
	rm -f "$b/meson-logs/testlog.json"
	meson test -C "$b" --print-errorlogs "${suite_args[@]}" </dev/null
	ran+=("$b")
done

# Fuzzing: each target for KVP_FUZZ_SECONDS (30) from its corpus, clang build of its own.
extras=()
if [[ $fuzz -eq 1 ]]; then
	echo "==== fuzz (tests/fuzz/run.sh, ${KVP_FUZZ_SECONDS:-30} s per target)"
	frc=0
	tests/fuzz/run.sh --seconds "${KVP_FUZZ_SECONDS:-30}" </dev/null || frc=$?
	case $frc in
	0) extras+=("fuzz: libFuzzer runs=OK") ;;
	77) extras+=("fuzz: libFuzzer runs=SKIP") ;;
	*) extras+=("fuzz: libFuzzer runs=FAIL") ;;
	esac
fi

# A short soak: both daemons under mixed traffic and random faults (~1 min).
if [[ $fuzz -eq 1 ]]; then
	echo "==== soak (tools/soak.sh --short)"
	src=0
	tools/soak.sh --short --builddir "$builddir" </dev/null || src=$?
	case $src in
	0) extras+=("soak: short soak=OK") ;;
	77) extras+=("soak: short soak=SKIP") ;;
	*) extras+=("soak: short soak=FAIL") ;;
	esac
fi

# Totals from meson's testlog.json (one JSON object per test), plus build failures.
python3 - "${ran[@]}" -- "${build_failures[@]}" -- "${extras[@]}" <<'EOF'
import json, os, sys

args = sys.argv[1:]
sep = args.index("--")
builds, rest = args[:sep], args[sep + 1:]
sep = rest.index("--")
build_failures, extras = rest[:sep], rest[sep + 1:]
passed, failed, skipped = [], [], []
for b in builds:
    path = os.path.join(b, "meson-logs", "testlog.json")
    if not os.path.exists(path):
        failed.append((b, "no testlog.json (meson test did not run?)"))
        continue
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        t = json.loads(line)
        name = "%s: %s" % (b, t.get("name", "?"))
        res = t.get("result", "?")
        out = (t.get("stdout") or "") + "\n" + (t.get("stderr") or "")
        lines = [l.strip() for l in out.splitlines() if l.strip()]
        if res in ("OK", "EXPECTEDFAIL"):
            passed.append(name)
        elif res == "SKIP":
            why = [l for l in lines if "SKIP" in l] or lines[-1:] or ["(no reason printed)"]
            skipped.append((name, why[-1]))
        else:
            why = [l for l in lines if "FAIL:" in l or "SETUP ERROR" in l]
            failed.append((name, res + (": " + why[0] if why else "")))
for f in build_failures:
    failed.append((f, "BUILD"))
for e in extras:
    name, res = e.rsplit("=", 1)
    if res == "OK":
        passed.append(name)
    elif res == "SKIP":
        skipped.append((name, "clang/libFuzzer not available"))
    else:
        failed.append((name, "crash or failed replay (see its output above)"))

if failed:
    print("failed:")
    for n, why in failed:
        print("  %s (%s)" % (n, why))
if skipped:
    print("skipped:")
    for n, why in skipped:
        print("  %s: %s" % (n, why))
print("%d passed, %d failed, %d skipped" % (len(passed), len(failed), len(skipped)))
sys.exit(1 if failed else 0)
EOF
