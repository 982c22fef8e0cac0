#!/bin/sh
# test_chaos while shmem_enabled flips between its setting and within_size
# (0.5 s within_size, 1 s back, over and over): what an administrator or a
# benchmark script does to a machine whose pools are open. A clean home's
# page-in once wrote through the file, and the kernel then gave it a folio
# spanning the evicted pages beside it, which read as zeros without a
# fault (docs/design.md, "Heap folios"); test_chaos found such a page in
# every run of this. The setting is the whole machine's: run this with no
# other sparsebuf test beside it. It is put back, also on Ctrl-C; skipped,
# saying so, where it cannot be changed.
#   scripts/test-flip.sh [BUILD] [RUNS]
set -u
build=${1:-build}
runs=${2:-3}
. "$(dirname "$0")/knob.sh"
knob_shmem_ready "test_chaos with shmem_enabled flipping" || exit 0
knob=$knob_shmem
knob_stale
was=$(knob_value "$knob")
if [ "$was" = within_size ]; then
	echo "SKIP  test_chaos with shmem_enabled flipping: it is within_size" \
		"already (make test-folios runs the suite so)"
	echo "0 passed, 0 failed, 1 skipped"
	exit 0
fi
echo "(shmem_enabled flips for this run; if it is killed, restore it:" \
	"echo $was > $knob)"
flipper=
stop() {
	[ -n "$flipper" ] && kill "$flipper" 2>/dev/null &&
		{ wait "$flipper"; } 2>/dev/null
	flipper=
	knob_set "$knob" "$was" >/dev/null 2>&1
	knob_restore
}
trap stop EXIT
trap 'exit 130' INT TERM
trap 'exit 129' HUP
trap 'exit 141' PIPE
# Held by this run from here on (the flipper is a subshell: $$ is ours).
knob_set "$knob" "$was" || exit 1
(
	trap - EXIT
	# Never outlives the run ($$ is the script's: a kill -9 of it
	# leaves this loop, which then stops; knob_stale puts it back).
	while kill -0 $$ 2>/dev/null; do
		knob_set "$knob" within_size || exit 1
		sleep 0.5
		knob_set "$knob" "$was" || exit 1
		sleep 1
	done
) &
flipper=$!
passed=0 failed=0
for i in $(seq 1 "$runs"); do
	log=$build/tests/logs/test_flip.$i.log
	mkdir -p "$build/tests/logs"
	if "$build/tests/test_chaos" >"$log" 2>&1; then
		echo "PASS  test_chaos with shmem_enabled flipping, run $i"
		passed=$((passed + 1))
	else
		echo "FAIL  test_chaos with shmem_enabled flipping, run $i" \
			"(log: $log)"
		grep -m 5 'wrong\|FAILED' "$log" | sed 's/^/      /'
		failed=$((failed + 1))
	fi
done
stop
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
