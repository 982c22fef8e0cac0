#!/bin/sh
# Run every harness in $1 (build-fuzz/fuzz: libFuzzer binaries; or
# build-fuzz-replay/fuzz-replay: plain replay programs). For each:
#
#   1. replay tests/fuzz/corpus/NAME/ (seeds and past finds): must pass;
#   2. replay tests/fuzz/crashes/NAME/ one file at a time, each many times
#      (some are races): reproducers of bugs reported but not fixed yet.
#      Reported on their own line, not fatal; one that passes now should
#      move to the corpus;
#   3. fuzz for FUZZ_SECONDS (0: skip), starting from the corpus; new
#      inputs go to $1/work/NAME, crash/leak/timeout reproducers to
#      $1/artifacts/NAME/. Any finding fails.
#
# One line per harness, then "N passed, N failed, N skipped". A harness
# that cannot run here (no userfaultfd) exits 77 saying "SKIP: why".
# Steps 1 and 3 run with SBFUZZ_MASK set to the harness's known bugs
# (tests/fuzz/known-bugs), step 2 without: see fuzz_masked() in fuzz.h.
#
# FUZZ_NAMES="a b" picks some; FUZZ_JOBS=N runs N harnesses at a time
# (default 1: each fuzzer uses one CPU); FUZZ_KNOWN_FATAL=1 makes step 2
# fatal; FUZZ_KNOWN_RUNS (default 5000) is step 2's repetitions.
src=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --one ]; then
	one=$3
	set -- "$2"
fi
dir=${1:-build-fuzz/fuzz}
secs=${FUZZ_SECONDS:-60}
# A request too large for size_t returns NULL as in a normal build (the
# code under test must cope); one that fits but is huge is libFuzzer's
# -malloc_limit_mb finding.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=0}:allow_user_segv_handler=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
sym=/usr/lib/llvm-14/bin/llvm-symbolizer
[ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && [ -x "$sym" ] && export ASAN_SYMBOLIZER_PATH=$sym
# The harnesses parse SPARSEBUF_* themselves (fuzz_env) or want the
# defaults: none of the caller's.
for v in $(env | sed -n 's/^\(SPARSEBUF_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

# Per harness: the longest input worth trying (-max_len).
max_len() {
	case $1 in
	save) echo 65536 ;;
	# A KV save file holds an image per region, 12 KiB of tables each:
	# the seeds of 1-3 layers are 8-104 KiB.
	kvsave) echo 131072 ;;
	env | cli) echo 512 ;;
	*) echo 8192 ;;
	esac
}

# The finding: the message, then the stack frames in our sources.
tail_log() {
	grep -E 'ERROR|invariant|SUMMARY|#[0-9]+ 0x.* in [^ ]+ [^ ]*/(lib|tests|runner|flash|common|kernels|daemon)/|Test unit written' "$1" |
		grep -v 'fuzzer::' | head -n 25 | sed 's/^/      /'
}

# One harness, all three steps; prints its lines and, last, one word:
# pass, fail or skip.
run_one() {
	n=$1
	bin="$dir/fuzz_$n"
	log="$dir/logs/$n.corpus.log"
	known_log="$dir/logs/$n.known.log"
	corpus="$src/corpus/$n"
	crashes="$src/crashes/$n"
	start=$(date +%s)
	: >"$log"
	: >"$known_log"
	SBFUZZ_MASK=$(awk -v h="$n" '$1 == h { printf "%s ", $2 }' \
		"$src/known-bugs" 2>/dev/null)
	export SBFUZZ_MASK

	# 1. The corpus, every file once (the plain regression run).
	seeds=$(ls "$corpus" 2>/dev/null | wc -l)
	if [ "$seeds" -gt 0 ]; then
		timeout -k 5 600 "$bin" -error_exitcode=1 "$corpus"/* >>"$log" 2>&1
	else
		timeout -k 5 60 "$bin" -error_exitcode=1 /dev/null >>"$log" 2>&1
	fi
	rc=$?
	if [ $rc -eq 77 ] && grep -q '^SKIP' "$log"; then
		echo "SKIP  $n: $(grep -m1 '^SKIP' "$log" | sed 's/^SKIP: //')"
		echo skip
		return
	fi
	if [ $rc -ne 0 ]; then
		echo "FAIL  $n: corpus replay (exit $rc; log $log)"
		tail_log "$log"
		echo fail
		return
	fi

	# 2. Known crashes, each on its own.
	known="" fixed=""
	for f in "$crashes"/*; do
		[ -f "$f" ] || continue
		if SBFUZZ_MASK= timeout -k 5 300 "$bin" -error_exitcode=1 \
			-runs="${FUZZ_KNOWN_RUNS:-5000}" "$f" >>"$known_log" 2>&1; then
			fixed="$fixed $(basename "$f")"
		else
			known="$known $(basename "$f")"
		fi
	done

	# 3. Fuzz.
	runs=""
	if [ "$secs" -gt 0 ]; then
		work="$dir/work/$n"
		art="$dir/artifacts/$n"
		log="$dir/logs/$n.fuzz.log"
		mkdir -p "$work" "$art"
		: >"$log"
		timeout -k 10 $((secs + 300)) "$bin" -max_total_time="$secs" \
			-timeout=20 -rss_limit_mb=3072 -max_len="$(max_len "$n")" \
			-error_exitcode=1 -print_final_stats=1 \
			-artifact_prefix="$art/" "$work" "$corpus" >>"$log" 2>&1
		rc=$?
		if [ $rc -ne 0 ]; then
			what=$(grep -m1 -o 'Test unit written to [^ ]*' "$log" |
				sed 's/Test unit written to //')
			echo "FAIL  $n: fuzzing found a bug after $(( $(date +%s) - start )) s (exit $rc): ${what:-see $log}"
			tail_log "$log"
			echo fail
			return
		fi
		runs=", $(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1) runs in ${secs} s"
	fi
	echo "PASS  $n: corpus $seeds$runs ($(( $(date +%s) - start )) s)"
	[ -n "$fixed" ] && echo "FIXED $n: now pass, move to tests/fuzz/corpus/$n/:$fixed"
	if [ -n "$known" ]; then
		echo "KNOWN $n: still failing (reported, not fixed):$known"
		[ -n "${FUZZ_KNOWN_FATAL:-}" ] && { echo fail; return; }
	fi
	echo pass
}

# A harness's lines are printed when it is done (in one write: jobs
# running side by side do not interleave them).
if [ -n "${one:-}" ]; then
	run_one "$one" >"$dir/logs/$one.result" 2>&1
	sed '$d' "$dir/logs/$one.result"
	exit 0
fi

names=${FUZZ_NAMES:-$(cd "$dir" && ls | sed -n 's/^fuzz_//p' | sort)}
mkdir -p "$dir/logs"
rm -f "$dir/logs/"*.result
for n in $names; do
	[ -x "$dir/fuzz_$n" ] && echo "$n"
done | xargs -P "${FUZZ_JOBS:-1}" -n 1 sh "$0" --one "$dir"

pass=0 fail=0 skip=0 failed=""
for n in $names; do
	r="$dir/logs/$n.result"
	[ -x "$dir/fuzz_$n" ] || continue
	case $(tail -n 1 "$r" 2>/dev/null) in
	pass) pass=$((pass + 1)) ;;
	skip) skip=$((skip + 1)) ;;
	*) fail=$((fail + 1)); failed="$failed $n" ;;
	esac
done
[ -n "$failed" ] && echo "failed:$failed (logs in $dir/logs)"
if [ "$skip" -gt 0 ]; then
	echo "$pass passed, $fail failed, $skip skipped"
else
	echo "$pass passed, $fail failed"
fi
[ "$fail" -eq 0 ]
