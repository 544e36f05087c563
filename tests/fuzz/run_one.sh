#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Run one libFuzzer target (used by the 'fuzz' meson suite and tests/fuzz/run.sh).
#
# Usage: run_one.sh EXE NAME SRCDIR fuzz|replay [SECONDS]
#   fuzz    fuzz for SECONDS (default $KVP_FUZZ_SECONDS or 30) from corpus/NAME
#           and regress/NAME (a kept crash fails the run at once, every time);
#           new inputs go to a work corpus next to EXE (fuzz-work/NAME), never
#           into the source tree; a crash is saved under fuzz-work/NAME/artifacts
#   replay  run every input of corpus/NAME and regress/NAME once
# Prints one line "fuzz NAME: ..." with the executions; exits 1 on a crash,
# a leak, a hang (-timeout) or a sanitizer report, 0 otherwise.
set -uo pipefail

[[ $# -ge 4 ]] || { echo "usage: $0 EXE NAME SRCDIR fuzz|replay [SECONDS]" >&2; exit 2; }
exe=$(realpath "$1") name=$2 src=$3 mode=$4
secs=${5:-${KVP_FUZZ_SECONDS:-30}}
corpus=$src/corpus/$name
regress=$src/regress/$name
work=$(dirname "$exe")/fuzz-work/$name
mkdir -p "$work/corpus" "$work/artifacts" || exit 99

# Sanitizer reports are crashes; UBSan does not stop by itself.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:symbolize=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}

# libFuzzer's own default exit codes (77, 70) would read as SKIP to meson.
common=(-error_exitcode=1 -timeout_exitcode=1 -timeout=20 -rss_limit_mb=4096
	-artifact_prefix="$work/artifacts/" -print_final_stats=1)
log=$work/$mode.log

case $mode in
replay)
	mapfile -t inputs < <(find "$corpus" "$regress" -type f ! -name '.*' ! -name 'README*' 2>/dev/null | sort)
	if [[ ${#inputs[@]} -eq 0 ]]; then
		echo "fuzz $name: no inputs in $corpus or $regress"
		exit 1
	fi
	rc=0
	# (in a subshell: its "Aborted" notice goes to the log, not the terminal)
	("$exe" "${common[@]}" "${inputs[@]}"; exit $?) >"$log" 2>&1 || rc=$?
	n=$(grep -c '^Running: ' "$log")
	if [[ $rc -ne 0 ]]; then
		tail -n 60 "$log"
		bad=$(grep '^Running: ' "$log" | tail -n 1 | sed 's/^Running: //')
		echo "fuzz $name: replay FAILED on $bad ($n of ${#inputs[@]} inputs run)"
		exit 1
	fi
	echo "fuzz $name: replayed ${#inputs[@]} inputs (corpus + regress), no failure"
	exit 0
	;;
fuzz)
	dict=()
	[[ -f $src/$name.dict ]] && dict=(-dict="$src/$name.dict")
	seeds=("$corpus")
	[[ -d $regress ]] && seeds+=("$regress")
	rc=0
	("$exe" "${common[@]}" -max_total_time="$secs" "${dict[@]}" "$work/corpus" "${seeds[@]}"; exit $?) \
		>"$log" 2>&1 || rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
	cov=$(grep -E '^#[0-9]+' "$log" | tail -n 1 | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
	ncorp=$(find "$work/corpus" -type f | wc -l)
	if [[ $rc -ne 0 ]]; then
		tail -n 80 "$log"
		art=$(sed -n "s/.*Test unit written to \(.*\)/\1/p" "$log" | tail -n 1)
		if ! grep -qE '[[:space:]]INITED[[:space:]]' "$log"; then
			# It crashed while loading the seeds: a kept regression input (or a seed) still fails.
			echo "fuzz $name: CRASH on a seed or regress input (known, not fixed yet; see $src/regress/README.md)"
			exit 1
		fi
		echo "fuzz $name: to keep it as a regression input: cp ${art:-INPUT} $regress/"
		echo "fuzz $name: NEW CRASH after ${execs:-?} execs; input: ${art:-see $log}"
		exit 1
	fi
	echo "fuzz $name: ${execs:-0} execs in ${secs}s (${rate:-0}/s), cov ${cov:-?}, work corpus $ncorp inputs, no crash"
	exit 0
	;;
*)
	echo "unknown mode '$mode'" >&2
	exit 2
	;;
esac
