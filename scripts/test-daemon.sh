#!/bin/sh
# The whole test suite once more with every default pool a client of
# sparsebufd (SPARSEBUF_DAEMON): a daemon on a temporary socket with a
# budget as large as the tests may use, tests/run.sh, then the daemon's
# own view (no client left, nothing leased) and a clean stop. The
# daemon's pages are 16 KiB, the KV tests' (test_kv_session): their prefix
# caches are then machine-wide too (SBTEST_MACHINE_CACHE tells the tests
# whose expectations differ: what a process's cache let go of is still
# found on the machine).
#   scripts/test-daemon.sh BUILD
set -u
build=${1:-build}
dir=$(mktemp -d /tmp/sbd-suite-XXXXXX)
sock=$dir/sock
"$build/bin/sparsebufd" --socket "$sock" --max-bytes 16G --page-size 16K \
	--foreground \
	2>"$dir/daemon.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
"$build/bin/sparsebufctl" -s "$sock" wait --timeout 10000 || exit 1
# test_daemon starts daemons of its own. (test_chaos's hang, seen here
# once, was a lost wake-up of SB_PREFETCH_WAIT when a cancel emptied the
# queue, in any pool: fixed in lib/prefetch.c.)
tests=${TESTS:-$(cd "$build/tests" && ls | grep "^test_" |
	grep -v -e "^test_daemon$" | sort)}
# The default pool of every test, and (SBTEST_DAEMON_POOLS, harness.h)
# the pools the tests make themselves: clients all.
# test_stress's million map/unmap cycles run in make test; a client pool
# runs the same paths, 20k cycles are enough here.
SB_STRESS_CYCLES=${SB_STRESS_CYCLES:-20000} \
SPARSEBUF_DAEMON=$sock SBTEST_DAEMON_POOLS=1 SBTEST_MACHINE_CACHE=1 \
	TESTS="$tests" \
	tests/run.sh "$build/tests"
rc=$?
echo "sparsebufd after the suite:"
"$build/bin/sparsebufctl" -s "$sock" status | sed 's/^/  /'
# Every client gone: what is still counted is the machine-wide cache's
# blocks (they outlive their processes), nothing else.
json=$("$build/bin/sparsebufctl" -s "$sock" status --json)
used=$(echo "$json" | sed -n 's/.*"bytes_used": \([0-9]*\).*/\1/p')
shared=$(echo "$json" | sed -n 's/.*"bytes_shared": \([0-9]*\).*/\1/p')
echo "$json" | grep -q '"clients_total": [1-9][0-9]*, .*"clients": \[\]' &&
	[ -n "$used" ] && [ "$used" = "$shared" ] || {
	echo "FAIL: the daemon still counts pages of exited processes"
	rc=1
}
case " $tests " in
*" test_kv_session "*)
	echo "$json" | grep -q '"cache_blocks": [1-9]' || {
		echo "FAIL: the KV tests put nothing in the machine-wide cache"
		rc=1
	} ;;
esac
kill $pid
wait $pid || { echo "FAIL: sparsebufd did not stop cleanly"; rc=1; }
grep -v -e 'listening on' -e 'stopping' -e ': back, holding' "$dir/daemon.log" | head -20
exit $rc
