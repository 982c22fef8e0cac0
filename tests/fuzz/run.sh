#!/bin/sh
# Run every harness in $1 (build-fuzz/fuzz: libFuzzer binaries; or
# build-fuzz-replay/fuzz-replay: plain replay programs). For each:
#
#   1. replay tests/fuzz/corpus/NAME/ (seeds and past finds): must pass;
#   2. replay tests/fuzz/crashes/NAME/ one file at a time: reproducers of
#      bugs reported but not fixed yet. Reported on their own line, not
#      fatal; one that passes now should move to the corpus;
#   3. fuzz for FUZZ_SECONDS (0: skip), starting from the corpus; new
#      inputs go to $1/work/NAME, crash/leak/timeout reproducers to
#      $1/artifacts/NAME/. Any finding fails.
#
# One line per harness, then "N passed, N failed, N skipped". A harness
# that cannot run here (no userfaultfd) exits 77 saying "SKIP: why".
# Steps 1 and 3 run with SBFUZZ_MASK set to the harness's known bugs
# (tests/fuzz/known-bugs), step 2 without: see fuzz_masked() in fuzz.h.
# FUZZ_NAMES="a b" picks some; FUZZ_KNOWN_FATAL=1 makes step 2 fatal.
dir=${1:-build-fuzz/fuzz}
secs=${FUZZ_SECONDS:-60}
src=$(cd "$(dirname "$0")" && pwd)
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

pass=0 fail=0 skip=0 failed=""
names=${FUZZ_NAMES:-$(cd "$dir" && ls | sed -n 's/^fuzz_//p' | sort)}
mkdir -p "$dir/logs"

# Per harness: the longest input worth trying (-max_len).
max_len() {
	case $1 in
	save) echo 65536 ;;
	env) echo 512 ;;
	*) echo 8192 ;;
	esac
}

# The finding: the message, then the stack frames in our sources.
tail_log() {
	grep -E 'ERROR|invariant|SUMMARY|  fd [0-9]|#[0-9]+ 0x.* in [^ ]+ [^ ]*/(lib|tests|runner|flash|common|kernels)/|Test unit written' "$1" |
		grep -v 'fuzzer::' | head -n 25 | sed 's/^/      /'
}

for n in $names; do
	bin="$dir/fuzz_$n"
	[ -x "$bin" ] || continue
	log="$dir/logs/$n.corpus.log"
	corpus="$src/corpus/$n"
	crashes="$src/crashes/$n"
	: >"$log"
	known_log="$dir/logs/$n.known.log"
	: >"$known_log"
	start=$(date +%s)
	SBFUZZ_MASK=$(awk -v h="$n" '$1 == h { printf "%s ", $2 }' \
		"$src/known-bugs" 2>/dev/null)
	export SBFUZZ_MASK

	# 1. The corpus, every file once (the plain regression run).
	seeds=$(ls "$corpus" 2>/dev/null | wc -l)
	if [ "$seeds" -gt 0 ]; then
		timeout -k 5 600 "$bin" -error_exitcode=1 "$corpus"/* >>"$log" 2>&1
		rc=$?
	else
		timeout -k 5 60 "$bin" -error_exitcode=1 /dev/null >>"$log" 2>&1
		rc=$?
	fi
	if [ $rc -eq 77 ] && grep -q '^SKIP' "$log"; then
		skip=$((skip + 1))
		echo "SKIP  $n: $(grep -m1 '^SKIP' "$log" | sed 's/^SKIP: //')"
		continue
	fi
	if [ $rc -ne 0 ]; then
		fail=$((fail + 1)); failed="$failed $n"
		echo "FAIL  $n: corpus replay (exit $rc; log $log)"
		tail_log "$log"
		continue
	fi

	# 2. Known crashes, each on its own, many times: some are races
	# (a plain replay program runs each once).
	known="" fixed="" reps=${FUZZ_KNOWN_RUNS:-5000}
	for f in "$crashes"/*; do
		[ -f "$f" ] || continue
		if SBFUZZ_MASK= timeout -k 5 120 "$bin" -error_exitcode=1 -runs=$reps "$f" >>"$known_log" 2>&1; then
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
		mkdir -p "$work" "$art"
		log="$dir/logs/$n.fuzz.log"
		: >"$log"
		timeout -k 10 $((secs + 300)) "$bin" -max_total_time="$secs" \
			-timeout=20 -rss_limit_mb=3072 -max_len="$(max_len "$n")" \
			-error_exitcode=1 -print_final_stats=1 \
			-artifact_prefix="$art/" "$work" "$corpus" >>"$log" 2>&1
		rc=$?
		if [ $rc -ne 0 ]; then
			fail=$((fail + 1)); failed="$failed $n"
			what=$(grep -m1 -o 'Test unit written to [^ ]*' "$log" |
				sed 's/Test unit written to //')
			echo "FAIL  $n: fuzzing found a bug after $(( $(date +%s) - start )) s (exit $rc): ${what:-see $log}"
			tail_log "$log"
			continue
		fi
		runs=", $(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1) runs in ${secs} s, $(ls "$work" | wc -l) inputs in $work"
	fi
	pass=$((pass + 1))
	echo "PASS  $n: corpus $seeds$runs ($(( $(date +%s) - start )) s)"
	if [ -n "$known" ]; then
		echo "KNOWN $n: still failing (reported, not fixed):$known"
		[ -n "${FUZZ_KNOWN_FATAL:-}" ] && { fail=$((fail + 1)); failed="$failed $n"; }
	fi
	[ -n "$fixed" ] && echo "FIXED $n: now pass, move to tests/fuzz/corpus/$n/:$fixed"
done
[ -n "$failed" ] && echo "failed:$failed (logs in $dir/logs)"
if [ "$skip" -gt 0 ]; then
	echo "$pass passed, $fail failed, $skip skipped"
else
	echo "$pass passed, $fail failed"
fi
[ "$fail" -eq 0 ]
