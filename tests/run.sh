#!/bin/sh
# Run every test binary in $1 under a timeout; print one line per test and,
# last, exactly one line "N passed, N failed, N skipped".
# TEST_TIMEOUT (seconds, default 600) bounds each test; TESTS="a b" picks
# some; TEST_JOBS (default 2; 1: one after the other, in order) runs that
# many at once, each line printed as its test ends. Most tests keep less
# than a CPU busy (faults, I/O, their children): two at once take the
# suite from 204 to 152 s on 2 vCPUs, TSan's from 482 to 395. A test in
# `alone` runs with nothing beside it: test_inject lowers
# vm.max_map_count, which is the whole machine's; test_daemon_hugetlb
# counts the machine's free huge pages, which test_hugetlb uses too.
dir=${1:-build/tests}
timeout_s=${TEST_TIMEOUT:-600}
jobs=${TEST_JOBS:-2}
case $jobs in '' | *[!0-9]* | 0) jobs=1 ;; esac
alone=" test_inject test_daemon_hugetlb "
logdir="$dir/logs"
# This run's reports and the pids of its timeouts, apart from any other
# run's (one interrupted a moment ago may still be ending).
state="$logdir/.run-$$"
mkdir -p "$state" || exit 1
# A setting a killed bench or test script left changed (a raised
# vm.max_map_count makes tests skip) goes back first.
. "$(dirname "$0")/../scripts/knob.sh"
knob_stale
pass=0 fail=0 skip=0 failed=""
# A failing test's log: the lines that say what failed (they may be far
# from the end when a test runs several configurations), then its tail.
show_failure() {
	grep -n -m 20 -E 'FAIL|ERROR|Sanitizer|WARNING: ThreadSanitizer|mismatch|SIGBUS' "$1" |
		sed 's/^/      > /'
	tail -n 20 "$1" | sed 's/^/      /'
}
# run_one TEST: run it; its report (one word, pass, fail or skip, then
# the lines to print) goes to $state/TEST.res, complete once renamed.
run_one() {
	t=$1 bin="$dir/$1" log="$logdir/$1.log" res="$state/$1.res"
	start=$(date +%s%N)
	# (timeout puts itself in a process group of its own, out of a
	# terminal's Ctrl-C: stop() passes the signal on.)
	timeout -k 5 "$timeout_s" "$bin" >"$log" 2>&1 &
	echo $! >"$state/$t.pid"
	wait $!
	rc=$?
	rm -f "$state/$t.pid"
	secs=$(awk "BEGIN { printf \"%.1f\", ($(date +%s%N) - $start) / 1e9 }")
	case $rc in
	0) echo pass; echo "PASS  $t (${secs}s)" ;;
	77) echo skip; echo "SKIP  $t: $(grep -m1 '^SKIP' "$log" | sed 's/^SKIP: //')" ;;
	124|137) echo fail; echo "FAIL  $t: timed out after ${timeout_s}s"; tail -n 20 "$log" | sed 's/^/      /' ;;
	*) echo fail; echo "FAIL  $t (exit $rc)"; show_failure "$log" ;;
	esac >"$res.part"
	mv "$res.part" "$res"
}
# Print and count the reports of the tests that ended; sets $running
# (TEST:PID of the shell running it). A shell gone without a report (it
# was killed) is a failure, not a wait for ever.
running=""
count_report() {	# TEST REPORT
	case $(head -n 1 "$2") in
	pass) pass=$((pass + 1)) ;;
	skip) skip=$((skip + 1)) ;;
	*) fail=$((fail + 1)); failed="$failed $1" ;;
	esac
	tail -n +2 "$2"
	rm -f "$2"
}
# Alive, and not a zombie waiting for this shell to reap it.
running_pid() {
	case $(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) in
	'' | Z) return 1 ;;
	esac
}
reap() {
	still=""
	for e in $running; do
		r=${e%%:*}
		if [ -f "$state/$r.res" ]; then
			count_report "$r" "$state/$r.res"
		elif running_pid "${e#*:}"; then
			still="$still $e"
		elif [ -f "$state/$r.res" ]; then
			count_report "$r" "$state/$r.res"
		else
			fail=$((fail + 1)); failed="$failed $r"
			echo "FAIL  $r: its runner ended without a report"
		fi
	done
	running=$still
}
count() { set -- $running; echo $#; }
wait_below() {	# until fewer than $1 tests run
	reap
	while [ "$(count)" -ge "$1" ]; do
		sleep 0.1
		reap
	done
}
stop() {
	for p in "$state"/*.pid; do
		[ -f "$p" ] && kill -TERM "$(cat "$p")" 2>/dev/null
	done
	wait
	rm -rf "$state"
	exit 130
}
trap stop INT TERM
tests=${TESTS:-$(cd "$dir" && ls | grep '^test_' | sort)}
# test_hugetlb and test_daemon_hugetlb need 64 huge pages free (128
# MiB), one after the other (test_daemon_hugetlb runs alone): reserved
# for the run where we may (root), put back at its end, and by the next
# script's knob_stale after a kill -9. Without them they skip, saying why.
hugepages=/proc/sys/vm/nr_hugepages
huge_need=0
for t in test_hugetlb test_daemon_hugetlb; do
	case " $(echo $tests) " in
	*" $t "*) [ -x "$dir/$t" ] && huge_need=64 ;;
	esac
done
if [ $huge_need -gt 0 ] && [ -w "$hugepages" ]; then
	trap knob_restore EXIT
	knob_hugepages $huge_need >/dev/null || true
fi
# The longest first (under the sanitizers too), so that the last test
# to end is not one that started last; the one that runs alone before.
first="test_inject test_stress test_daemon test_flash test_hugetlb test_share test_chaos test_cli test_leaks test_evict_busy"
if [ "$jobs" -gt 1 ]; then
	order=""
	for t in $first; do
		case " $(echo $tests) " in *" $t "*) order="$order $t" ;; esac
	done
	for t in $tests; do
		case " $first " in *" $t "*) ;; *) order="$order $t" ;; esac
	done
	tests=$order
fi
seen=" "
for t in $tests; do
	[ -x "$dir/$t" ] || continue
	case $seen in *" $t "*) continue ;; esac	# named twice: once
	seen="$seen$t "
	case $alone in
	*" $t "*) wait_below 1; run_one "$t"; count_report "$t" "$state/$t.res" ;;
	*) wait_below "$jobs"; run_one "$t" & running="$running $t:$!" ;;
	esac
done
wait_below 1
wait
rm -rf "$state"
[ -n "$failed" ] && echo "failed:$failed (logs in $logdir)"
if [ "$skip" -gt 0 ]; then
	echo "$pass passed, $fail failed, $skip skipped"
else
	echo "$pass passed, $fail failed"
fi
[ "$fail" -eq 0 ]
