#!/bin/sh
# The whole test suite once more with every default pool a client of
# sparsebufd (SPARSEBUF_DAEMON): a daemon on a temporary socket with a
# budget as large as the tests may use, tests/run.sh, then the daemon's
# own view (no client left, nothing leased) and a clean stop.
#   scripts/test-daemon.sh BUILD
set -u
build=${1:-build}
dir=$(mktemp -d /tmp/sbd-suite-XXXXXX)
sock=$dir/sock
"$build/bin/sparsebufd" --socket "$sock" --max-bytes 16G --foreground \
	2>"$dir/daemon.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
"$build/bin/sparsebufctl" -s "$sock" wait --timeout 10000 || exit 1
# test_daemon starts daemons of its own.
# test_chaos: KNOWN BUG, left out here until fixed (issue 15's note): with
# every pool a client, its fork-heavy "plain" configuration with the sync
# pager hung once in 3 CI runs (child killed after 68 s). It runs in every
# other suite (make test, asan, tsan, lockcheck) with local pools.
tests=${TESTS:-$(cd "$build/tests" && ls | grep "^test_" |
	grep -v -e "^test_daemon$" -e "^test_chaos$" | sort)}
case " $tests " in
*" test_chaos "*) ;;
*) echo "SKIP  test_chaos with client pools: a known hang (fork-heavy chaos, sync pager), not fixed yet" ;;
esac
# The default pool of every test, and (SBTEST_DAEMON_POOLS, harness.h)
# the pools the tests make themselves: clients all.
SPARSEBUF_DAEMON=$sock SBTEST_DAEMON_POOLS=1 TESTS="$tests" \
	tests/run.sh "$build/tests"
rc=$?
echo "sparsebufd after the suite:"
"$build/bin/sparsebufctl" -s "$sock" status | sed 's/^/  /'
"$build/bin/sparsebufctl" -s "$sock" status --json |
	grep -q '"bytes_used": 0, .*"clients_total": [1-9][0-9]*, "clients": \[\]' || {
	echo "FAIL: the daemon still counts pages of exited processes"
	rc=1
}
kill $pid
wait $pid || { echo "FAIL: sparsebufd did not stop cleanly"; rc=1; }
grep -v -e 'listening on' -e 'stopping' -e ': back, holding' "$dir/daemon.log" | head -20
exit $rc
