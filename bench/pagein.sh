#!/bin/sh
# The disk-tier benchmark in one command (make bench-pagein):
#   bench/pagein.sh [BUILD_DIR] [pagein options]
# runs bench/pagein (sequential, random, evict against fio and mmap; one
# table of ratios and targets), its sequential part again on 2 MiB pages
# (shmem huge folios, then heaps of huge pages: SPARSEBUF_HUGETLB=1, where
# huge pages can be reserved), and then bench/pagein-perf.sh (the
# sequential reader's fault counts under perf next to the library's).
# Options go to both, e.g. --quick (a smoke run of a few seconds), --dir D,
# --size 2G, --reps N, --page-size 1M; see bench/pagein.c (pagein --help).
#   bench/pagein.sh --help | --version
set -u
cli_name=pagein.sh
usage() {
	cat <<EOT
usage: bench/pagein.sh [BUILD_DIR] [pagein options]

The disk-tier benchmark: BUILD_DIR/bench/pagein (default build), its
sequential part again on 2 MiB pages (shmem huge folios, then heaps of
huge pages where they can be reserved for the run), then
bench/pagein-perf.sh, all with the options given (BUILD_DIR/bench/pagein
--help lists them; --quick is a smoke run of seconds).

options:
  --help                   print this help and exit
  --version                print the version and exit
EOT
}
. "$(dirname "$0")/cli-lib.sh"
. "$(dirname "$0")/../scripts/knob.sh"
for a in "$@"; do
	case $a in
	--help | -h | --version) cli_std "$a" ;;
	esac
done
build=build
case "${1:-}" in
"" | -*) ;;
*) build=$1; shift ;;
esac
[ -x "$build/bench/pagein" ] || { echo "$cli_name: $build/bench/pagein missing (make)" >&2; exit 1; }
status=0
"$build/bench/pagein" "$@" || status=$?
# 2: a bad option, which pagein has named; perf would only repeat it.
[ $status -eq 2 ] && exit 2
# The heaps' huge folios (issue 12's lever): sparsebuf never changes the
# system's shmem_enabled; this run does, for the sequential test alone at
# 2 MiB pages, and puts it back (also on Ctrl-C). Both ways are printed.
# A run that could not be set up (status 1: the file, the directory) has
# nothing to compare, and the setting is the whole machine's: every live
# pool's heaps get their folios by it (docs/design.md, "Heap folios"), so
# it is never changed for nothing.
thp=/sys/kernel/mm/transparent_hugepage/shmem_enabled
if [ $status -eq 1 ]; then
	echo
	echo "=== sequential, 2 MiB pages, shmem_enabled=within_size"
	echo "(the run above failed: skipped)"
elif [ -w "$thp" ]; then
	knob_stale
	was=$(knob_value "$thp")
	# A kill -9 cannot be trapped: say how to put it back first (the
	# next bench or test script that changes a setting does it too).
	echo
	echo "(shmem_enabled is set for the next run; if this is killed, restore it: echo $was > $thp)"
	trap knob_restore EXIT
	trap 'exit 130' INT TERM
	trap 'exit 129' HUP
	trap 'exit 141' PIPE
	for mode in "$was" within_size; do
		echo
		echo "=== sequential, 2 MiB pages, shmem_enabled=$mode (heap folios; restored to $was after)"
		knob_set "$thp" "$mode" || break
		"$build/bench/pagein" "$@" --only seq --page-size 2M || true
	done
	knob_restore
	trap - EXIT INT TERM HUP PIPE
fi
# Heaps of huge pages (docs/api.md "Huge-page heaps"): sparsebuf never
# reserves them; this run raises vm.nr_hugepages to what the file needs
# when fewer are free, takes each once (bench/hugewarm: on some VMs a huge
# page's first use is the host's first backing of it), runs the sequential
# part at 2 MiB pages with SPARSEBUF_HUGETLB=1, and puts the setting back.
hugetlb_seq() {
	# The file's size as pagein resolves these options; its pages, the
	# ready reserve and heap slack.
	bytes=$("$build/bench/pagein" "$@" --file-bytes) || return 0
	trap knob_restore EXIT
	trap 'exit 130' INT TERM
	trap 'exit 129' HUP
	trap 'exit 141' PIPE
	if knob_hugepages $((bytes / 2097152 + 96)); then
		[ -x "$build/bench/hugewarm" ] && "$build/bench/hugewarm"
		SPARSEBUF_HUGETLB=1 "$build/bench/pagein" "$@" --only seq \
			--page-size 2M || hstatus=$?
	else
		echo "($knob_why: skipped)"
	fi
	knob_restore
	trap - EXIT INT TERM HUP PIPE
}
echo
echo "=== sequential, 2 MiB pages, heaps of huge pages (SPARSEBUF_HUGETLB=1)"
knob_stale
hstatus=0
# 1: the run could not be set up (the file, the directory): nothing to
# reserve huge pages for.
if [ $status -eq 1 ]; then
	echo "(the run above failed: skipped)"
else
	hugetlb_seq "$@"
fi
# 3 (a target missed) counts; the default run's status stays first.
[ $hstatus -ne 0 ] && [ $status -eq 0 ] && status=$hstatus
echo
echo "=== fault counts (bench/pagein-perf.sh)"
bench/pagein-perf.sh "$build" "$@"
r=$?
# 77: perf cannot run here, not a failure of the benchmark.
[ $r -ne 0 ] && [ $r -ne 77 ] && [ $status -eq 0 ] && status=$r
exit $status
