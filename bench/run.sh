#!/bin/sh
# Run the benchmarks (make bench). Each prints its baseline, our figure,
# the ratio and the target in one run; docs/PERFORMANCE.md records them.
#   bench/run.sh [BUILD_DIR]
#   bench/run.sh --help | --version
set -u
cli_name=run.sh
usage() {
	cat <<EOT
usage: bench/run.sh [BUILD_DIR]

Run every benchmark against the programs in BUILD_DIR (default build):
place, ptflood, pagecost, perf-faults.sh, sessions, kernels_*, hugetlb.sh,
pagein.sh, flash.sh. Exit status 1 when
one fails or misses a target.

options:
  --help                   print this help and exit
  --version                print the version and exit
EOT
}
. "$(dirname "$0")/cli-lib.sh"
build=build
for a in "$@"; do
	cli_std "$a"
done
[ $# -le 1 ] || cli_fail "one BUILD_DIR expected, not $#"
[ $# -eq 1 ] && build=$1
status=0
step() {
	echo
	echo "=== $*"
	"$@" || status=1
}
step "$build/bench/place"
# Page-directory writes on a shadow-paging host (a few seconds).
step "$build/bench/ptflood"
# What a page read in and released costs this host, step by step (2 s).
step "$build/bench/pagecost"
step bench/perf-faults.sh "$build"
# KV sessions: a shared system prompt, idle conversations parked (about
# 30 s).
step "$build/bench/sessions"
for b in "$build"/bench/kernels_*; do
	[ -x "$b" ] && step "$b"
done
# KV growth (8k and 32k tokens) and placement on huge-page heaps, huge
# pages reserved for the run where it may (about 8 min; 77: it may not).
echo
echo "=== bench/hugetlb.sh --build $build --rounds 1"
bench/hugetlb.sh --build "$build" --rounds 1
case $? in 0 | 77) ;; *) status=1 ;; esac
# The disk tier: a 2 GiB file under /var/tmp/sparsebuf-bench (made once),
# against fio and mmap, then its fault counts under perf.
step bench/pagein.sh "$build"
# LLM in a flash: a synthetic 1 GiB ReLU model (made once under
# $build/flash) under half its size, four modes.
step bench/flash.sh --build "$build"
exit $status
