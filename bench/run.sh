#!/bin/sh
# Run the benchmarks (make bench). Each prints its baseline, our figure,
# the ratio and the target in one run; docs/PERFORMANCE.md records them.
#   bench/run.sh [BUILD_DIR]
set -u
build=${1:-build}
status=0
step() {
	echo
	echo "=== $*"
	"$@" || status=1
}
step "$build/bench/place"
step bench/perf-faults.sh "$build"
for b in "$build"/bench/kernels_*; do
	[ -x "$b" ] && step "$b"
done
exit $status
