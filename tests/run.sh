#!/bin/sh
# Run every test binary in $1 under a timeout; print one line per test and,
# last, exactly one line "N passed, N failed, N skipped".
# TEST_TIMEOUT (seconds, default 600) bounds each test; TESTS="a b" picks some.
dir=${1:-build/tests}
timeout_s=${TEST_TIMEOUT:-600}
logdir="$dir/logs"
mkdir -p "$logdir"
pass=0 fail=0 skip=0 failed=""
# A failing test's log: the lines that say what failed (they may be far
# from the end when a test runs several configurations), then its tail.
show_failure() {
	grep -n -m 20 -E 'FAIL|ERROR|Sanitizer|WARNING: ThreadSanitizer|mismatch|SIGBUS' "$1" |
		sed 's/^/      > /'
	tail -n 20 "$1" | sed 's/^/      /'
}
tests=${TESTS:-$(cd "$dir" && ls | grep '^test_' | sort)}
for t in $tests; do
	bin="$dir/$t"
	[ -x "$bin" ] || continue
	log="$logdir/$t.log"
	start=$(date +%s%N)
	timeout -k 5 "$timeout_s" "$bin" >"$log" 2>&1
	rc=$?
	secs=$(awk "BEGIN { printf \"%.1f\", ($(date +%s%N) - $start) / 1e9 }")
	case $rc in
	0) pass=$((pass + 1)); echo "PASS  $t (${secs}s)" ;;
	77) skip=$((skip + 1)); echo "SKIP  $t: $(grep -m1 '^SKIP' "$log" | sed 's/^SKIP: //')" ;;
	124|137) fail=$((fail + 1)); failed="$failed $t"; echo "FAIL  $t: timed out after ${timeout_s}s"; tail -n 20 "$log" | sed 's/^/      /' ;;
	*) fail=$((fail + 1)); failed="$failed $t"; echo "FAIL  $t (exit $rc)"; show_failure "$log" ;;
	esac
done
[ -n "$failed" ] && echo "failed:$failed (logs in $logdir)"
if [ "$skip" -gt 0 ]; then
	echo "$pass passed, $fail failed, $skip skipped"
else
	echo "$pass passed, $fail failed"
fi
[ "$fail" -eq 0 ]
