#!/bin/sh
# Fault counts of bench/pagein's sequential reader, from perf, next to the
# library's own counters.
#
#   bench/pagein-perf.sh [BUILD_DIR] [--dir D] [--size S] [--quick]
#                        [--page-size P]
#   bench/pagein-perf.sh --help | --version
#
# Runs `pagein --run sb` (one cold read of the file end to end through a
# sb_buf_open_file buffer) and `pagein --run mmap` (the same reader over
# mmap with the kernel's read-ahead) and attaches perf stat to each, once
# set up, twice:
#   - the whole process: page-faults, minor-faults, major-faults and the
#     library's USDT probes sdt_sparsebuf:* (fault, map, unmap, cow,
#     pagein, evict; a page read in from disk fires pagein);
#   - the reading thread alone: the same kernel counts, and the kernel's
#     tracepoint exceptions:page_fault_user filtered to the buffer's range.
# Expected: sdt_sparsebuf:fault = faults, sdt_sparsebuf:pagein =
# pages_in, sdt_sparsebuf:map = maps, faults in the range >= faults: one fault per page the reader
# reaches before its read is done (at most one per page), plus touches that
# race with a page's placement (the kernel resolves those on the new
# mapping); mmap takes one per fault-around block.
# Uses the same probe group as bench/perf-faults.sh: run one at a time.
set -u
cli_name=pagein-perf.sh
usage() {
	cat <<EOT
usage: bench/pagein-perf.sh [BUILD_DIR] [options]

Fault counts of bench/pagein's sequential reader (sparsebuf and mmap) from
perf, next to the library's counters. Exit status 77 when perf cannot
attach here.

options:
  --dir D                  where pagein's file is (as pagein)
  --size SIZE              the file's size (as pagein)
  --page-size SIZE         sparsebuf's page size (as pagein)
  --quick                  64 MiB, the machine's cache left alone
  --no-drop-caches         leave the machine's page cache alone
  --help                   print this help and exit
  --version                print the version and exit
The other options of pagein (bench/pagein.sh passes them all) are accepted
and ignored.
EOT
}
. "$(dirname "$0")/cli-lib.sh"
build=build
case "${1:-}" in
"" | -*) ;;
*) build=$1; shift ;;
esac
# Only the options that say which file and which pages.
args=""
while [ $# -gt 0 ]; do
	case "$1" in
	--quick | --no-drop-caches) args="$args $1" ;;
	--dir | --size | --page-size)
		cli_need "$1" $#
		args="$args $1 $2"
		shift ;;
	--reps | --touch | --only | --rand-blocks | --evict-size | --run | --wait)
		cli_need "$1" $#
		shift ;;
	--sweep | --verbose) ;;
	*) cli_std "$1"; cli_fail "unexpected argument '$1'" ;;
	esac
	shift
done
bin="$build/bench/pagein"
ROW_W=44
. "$(dirname "$0")/perf-lib.sh"
perf_setup "$bin"
# One probe name at a time: perf 6.1 cannot express every argument the
# compiler chose (an indexed memory operand: it drops it), and the kernel
# refuses a second site with other arguments under the same name, so
# 'sdt_sparsebuf:*' as a whole can fail. fault and pagein are the ones
# needed.
for ev in fault map unmap cow pagein evict; do
	perf probe -q -x "$bin" "sdt_sparsebuf:$ev" >/dev/null 2>&1 ||
		echo "(perf could not add the probe sdt_sparsebuf:$ev)" >&2
done
if ! perf probe -l 2>/dev/null | grep -q "sdt_sparsebuf:fault .*$bin" ||
	! perf probe -l 2>/dev/null | grep -q "sdt_sparsebuf:pagein .*$bin"; then
	echo "perf cannot attach uprobes here (needs root and tracefs)" >&2
	exit 77
fi
kernel_events="page-faults,minor-faults,major-faults"

run() { # name
	name=$1
	fifo="$tmp/$name.fifo"
	mkfifo "$fifo"
	# shellcheck disable=SC2086
	"$bin" --run "$name" --wait "$fifo" $args >"$tmp/$name.out" 2>"$tmp/$name.err" &
	pid=$!
	# Set up (the file made if need be, the cache dropped, the pool
	# started) when it prints the range.
	for _ in $(seq 600); do
		grep -q '^ranges=' "$tmp/$name.err" 2>/dev/null && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.2
	done
	set -- $(sed -n 's/^ranges=//p' "$tmp/$name.err")
	[ $# -eq 2 ] || { cat "$tmp/$name.err" >&2; exit 1; }
	perf stat -x, -e "$kernel_events" -e exceptions:page_fault_user \
		--filter "address >= $1 && address < $2" -t "$pid" \
		-o "$tmp/$name.thread" &
	p1=$!
	perf stat -x, -e "$kernel_events" -e "sdt_sparsebuf:*" -p "$pid" \
		-o "$tmp/$name.proc" &
	p2=$!
	sleep 0.5	# let perf attach
	echo go >"$fifo"
	wait "$pid" || { cat "$tmp/$name.err" >&2; exit 1; }
	wait "$p1" "$p2"
}
run sb
run mmap

row_ge() { # label perf ours: perf >= ours
	ok=no
	[ -n "$2" ] && [ -n "$3" ] && [ "$2" -ge "$3" ] && ok="yes (>=)"
	[ "$ok" = no ] && fail=1
	printf '%-44s %10s %10s   %s\n' "$1" "$2" "$3" "$ok"
}
mib=$(($(val sb bytes) >> 20))
echo "sequential read of $mib MiB through faults: sparsebuf pages of" \
	"$(($(val sb page_size) >> 10)) KiB, $(val sb MBps) MB/s; mmap $(val mmap MBps) MB/s"
echo
printf '%-44s %10s %10s   %s\n' "count" "perf" "sparsebuf" "agree"
row "sdt_sparsebuf:fault (process)" "$(count "$tmp/sb.proc" sdt_sparsebuf:fault)" "$(val sb faults)"
row "sdt_sparsebuf:pagein (process) = pages_in" "$(count "$tmp/sb.proc" sdt_sparsebuf:pagein)" \
	"$(val sb pages_in)"
row "sdt_sparsebuf:map (process) = maps" "$(count "$tmp/sb.proc" sdt_sparsebuf:map)" \
	"$(val sb maps)"
row_ge "page_fault_user in the buffer (reader)" \
	"$(count "$tmp/sb.thread" exceptions:page_fault_user)" "$(val sb faults)"
echo
echo "library: faults $(val sb faults), pages_in $(val sb pages_in)," \
	"bytes_read $(($(val sb bytes_read) >> 20)) MiB, fault_places $(val sb fault_places)," \
	"maps $(val sb maps)"
printf '\n%-34s %12s %12s %12s %16s\n' "perf stat" "page-faults" "minor-faults" \
	"major-faults" "faults in range"
for n in sb mmap; do
	for w in thread proc; do
		label="sparsebuf"
		[ "$n" = mmap ] && label="mmap"
		if [ "$w" = thread ]; then
			label="$label, reading thread"
			inr=$(count "$tmp/$n.thread" exceptions:page_fault_user)
		else
			label="$label, whole process"
			inr=""
		fi
		printf '%-34s %12s %12s %12s %16s\n' "$label" \
			"$(count "$tmp/$n.$w" page-faults)" "$(count "$tmp/$n.$w" minor-faults)" \
			"$(count "$tmp/$n.$w" major-faults)" "$inr"
	done
done
echo "Faults in the buffer beyond the library's: touches that raced with a page's"
echo "placement (its mmap done, MAP_POPULATE not yet) and that the kernel resolved"
echo "on the new mapping without the handler. The whole process's faults include"
echo "the pool's ready thread pre-faulting heap pages."
exit $fail
