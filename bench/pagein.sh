#!/bin/sh
# The disk-tier benchmark in one command (make bench-pagein):
#   bench/pagein.sh [BUILD_DIR] [pagein options]
# runs bench/pagein (sequential, random, evict against fio and mmap; one
# table of ratios and targets) and then bench/pagein-perf.sh (the
# sequential reader's fault counts under perf next to the library's).
# Options go to both, e.g. --quick (a smoke run of a few seconds), --dir D,
# --size 2G, --reps N, --page-size 1M; see bench/pagein.c.
set -u
build=build
case "${1:-}" in
"" | -*) ;;
*) build=$1; shift ;;
esac
status=0
"$build/bench/pagein" "$@" || status=$?
echo
echo "=== fault counts (bench/pagein-perf.sh)"
bench/pagein-perf.sh "$build" "$@"
r=$?
# 77: perf cannot run here, not a failure of the benchmark.
[ $r -ne 0 ] && [ $r -ne 77 ] && [ $status -eq 0 ] && status=$r
exit $status
