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
# LLM in a flash: a synthetic 1 GiB ReLU model (made once under
# $build/flash) under half its size, four modes.
step bench/flash.sh --build "$build"
exit $status
