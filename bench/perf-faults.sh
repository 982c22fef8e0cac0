#!/bin/sh
# Count a workload's faults with perf next to sparsebuf's own counters and
# show that they agree.
#
#   bench/perf-faults.sh [--check] [BUILD_DIR]
#   bench/perf-faults.sh --help | --version
#
# The workload (bench/fault_workload.c) grows 256 pages of 256 KiB by
# touching them, places 256 more with sb_buf_map, shares 64 and writes
# through the share, and prints the library's counters. perf stat attaches
# to it twice once its pool is set up:
#   - to the whole process: the library's USDT probes (sdt_sparsebuf:fault,
#     map, unmap, cow), which must equal the counters they mirror;
#   - to the calling thread alone: page-faults, minor-faults, major-faults,
#     and the kernel's tracepoint exceptions:page_fault_user filtered to the
#     buffers' address ranges (printed by the workload). That count must
#     equal the faults sparsebuf serviced: one kernel fault per page grown
#     on demand and one per first write to a shared page, plus the read
#     faults sb_buf_map takes to fill page tables (map_faults). The same 256
#     pages grown by the kernel's own demand paging take one per 4 KiB.
#     (The fault handler's and the ready thread's own faults, filling the
#     page tables of pages they place, show in the process total.)
# --check: exit 1 when a count disagrees (used by tests/test_perf).
set -u
cli_name=perf-faults.sh
usage() {
	cat <<EOT
usage: bench/perf-faults.sh [--check] [BUILD_DIR]

A workload's faults counted by perf next to sparsebuf's own counters
(BUILD_DIR/bench/fault_workload, default build). Exit status 77 when perf
cannot attach here.

options:
  --check                  exit 1 when a count disagrees
  --help                   print this help and exit
  --version                print the version and exit
EOT
}
. "$(dirname "$0")/cli-lib.sh"
check=0
build=
for a in "$@"; do
	case $a in
	--check) check=1 ;;
	-*) cli_std "$a" ;;
	*) [ -z "$build" ] || cli_fail "one BUILD_DIR expected"; build=$a ;;
	esac
done
build=${build:-build}
bin="$build/bench/fault_workload"
. "$(dirname "$0")/perf-lib.sh"
perf_setup "$bin"
if ! perf probe -q -x "$bin" "sdt_sparsebuf:*" >/dev/null 2>&1; then
	echo "perf cannot attach uprobes here (needs root and tracefs)" >&2
	exit 77
fi
kernel_events="page-faults,minor-faults,major-faults"
sdt_events="sdt_sparsebuf:fault,sdt_sparsebuf:map,sdt_sparsebuf:unmap,sdt_sparsebuf:cow"

run() { # name args...
	name=$1
	shift
	fifo="$tmp/$name.fifo"
	mkfifo "$fifo"
	"$bin" --wait "$fifo" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
	pid=$!
	sleep 0.3	# let the pool start its threads
	set -- $(sed -n 's/^ranges=//p' "$tmp/$name.err")
	filter="(address >= $1 && address < $2) || (address >= $3 && address < $4)"
	perf stat -x, -e "$kernel_events" -e exceptions:page_fault_user \
		--filter "$filter" -t "$pid" -o "$tmp/$name.thread" &
	p1=$!
	perf stat -x, -e "$kernel_events" -e "$sdt_events" -p "$pid" \
		-o "$tmp/$name.proc" &
	p2=$!
	sleep 0.5	# let perf attach
	echo go >"$fifo"
	wait "$pid" || { cat "$tmp/$name.err" >&2; exit 1; }
	wait "$p1" "$p2"
}
run sparse --pages 256 --maps 256 --cow 64
run none --pages 0 --maps 0 --cow 0
run anon --anon --pages 256

thread_pf() { count "$tmp/$1.thread" page-faults; }
echo "workload: 256 pages grown by touch, 256 placed with sb_buf_map, 64"
echo "shared and written (copy-on-write); pages of $(val sparse page_size) bytes"
echo
printf '%-42s %10s %10s   %s\n' "count" "perf" "sparsebuf" "agree"
row "sdt_sparsebuf:fault (process)" "$(count "$tmp/sparse.proc" sdt_sparsebuf:fault)" "$(val sparse faults)"
row "sdt_sparsebuf:map (process)" "$(count "$tmp/sparse.proc" sdt_sparsebuf:map)" "$(val sparse maps)"
row "sdt_sparsebuf:unmap (process)" "$(count "$tmp/sparse.proc" sdt_sparsebuf:unmap)" "$(val sparse unmaps)"
row "sdt_sparsebuf:cow (process)" "$(count "$tmp/sparse.proc" sdt_sparsebuf:cow)" "$(val sparse cow_copies)"
row "page_fault_user in the buffers (thread)" \
	"$(count "$tmp/sparse.thread" exceptions:page_fault_user)" "$(val sparse thread_faults)"
in_bufs=$(count "$tmp/sparse.thread" exceptions:page_fault_user)
echo
echo "calling thread: page-faults $(thread_pf sparse) = $in_bufs in the buffers + $(($(thread_pf sparse) - in_bufs)) elsewhere (the program itself; a run that grows nothing takes $(thread_pf none)),"
echo "  minor-faults $(count "$tmp/sparse.thread" minor-faults), major-faults $(count "$tmp/sparse.thread" major-faults)"
echo "  sparsebuf growth of 256 pages on demand: $(val sparse fault_places) faults, one per 256 KiB page"
echo "  sparsebuf placement of 256 pages:         $(val sparse map_faults) faults (sb_buf_map filling page tables by fault-around: map_faults)"
echo "  kernel demand paging of 256 pages:       $(count "$tmp/anon.thread" exceptions:page_fault_user) faults, one per 4 KiB ($(val anon anon_expected_faults))"
echo "whole process: page-faults $(count "$tmp/sparse.proc" page-faults) (the fault handler and the ready thread fill the page tables of the pages they place by read faults too)"
[ "$check" = 1 ] && exit $fail
exit 0
