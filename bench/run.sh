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
# The disk tier: a 2 GiB file under /var/tmp/sparsebuf-bench (made once),
# against fio and mmap, then its fault counts under perf.
step bench/pagein.sh "$build"
exit $status
