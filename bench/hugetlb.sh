#!/bin/sh
# KV cache growth and placement with the pools' heaps on huge pages
# (SPARSEBUF_HUGETLB=1, docs/api.md "Huge-page heaps"): bench/kv at each
# --tokens, then bench/place, R rounds. The baselines (dense, the kernel's
# demand paging, ...) are bench/kv's own, in the same runs; --thp makes
# the kernel's demand paging use transparent huge pages (MADV_HUGEPAGE),
# the kernel's nearest equivalent.
#
#   bench/hugetlb.sh [--rounds R] [--tokens LIST] [--strategies S]
#                    [--no-place] [--thp] [--full] [--out DIR] [--build DIR]
#   bench/hugetlb.sh --help | --version
#
# sparsebuf never reserves huge pages (vm.nr_hugepages is the
# administrator's); this benchmark raises it for its run to what the
# largest --tokens needs, puts it back at the end, also on Ctrl-C, and
# takes every reserved page once first (bench/hugewarm: on some VMs a
# huge page's first use is the host's first backing of it, milliseconds
# each). Where it cannot (not root, no huge pages, not enough memory) it
# says so and exits 77. Exit status 3 when a target line says FAIL.
set -u
cli_name=hugetlb.sh
usage() {
	cat <<EOT
usage: bench/hugetlb.sh [options]

bench/kv and bench/place with sparsebuf's heaps on huge pages
(SPARSEBUF_HUGETLB=1), huge pages reserved for the run and put back.

options:
  --rounds R               rounds, 1 to 16 (default 3)
  --tokens LIST            bench/kv's --tokens, comma-separated
                           (default 8192,32768)
  --strategies S           bench/kv's --strategies (default 4,5,7)
  --no-place               leave out bench/place
  --thp                    the kernel's demand paging with MADV_HUGEPAGE
  --full                   print bench/kv's whole report (make demo)
  --out DIR                bench/kv's charts (default BUILD/bench-hugetlb)
  --build DIR              where the benchmarks are (default build)
  --help                   print this help and exit
  --version                print the version and exit
EOT
}
. "$(dirname "$0")/cli-lib.sh"
. "$(dirname "$0")/../scripts/knob.sh"
rounds=3 tokens=8192,32768 strategies=4,5,7 place=1 thp="" full=0 build=build out=""
while [ $# -gt 0 ]; do
	case $1 in
	--rounds | --tokens | --strategies | --out | --build) cli_need "$1" $# ;;
	esac
	case $1 in
	--rounds) cli_uint "$1" "$2" 16; rounds=$2; shift ;;
	--tokens)
		case $2 in '' | *[!0-9,]* | ,* | *,) cli_fail "--tokens: '$2' is not a list of numbers" ;; esac
		tokens=$2; shift ;;
	--strategies) strategies=$2; shift ;;
	--no-place) place=0 ;;
	--thp) thp=1 ;;
	--full) full=1 ;;
	--out) out=$2; shift ;;
	--build) build=$2; shift ;;
	*) cli_std "$1"; cli_fail "unexpected argument '$1'" ;;
	esac
	shift
done
[ "$rounds" -ge 1 ] || cli_fail "--rounds must be 1 to 16"
out=${out:-$build/bench-hugetlb}
for b in kv place hugewarm; do
	[ -x "$build/bench/$b" ] || { echo "$cli_name: $build/bench/$b missing (make)" >&2; exit 1; }
done
knob=/proc/sys/vm/nr_hugepages
# Pages: the largest cache (144 KiB a token), a page per region of slack
# and the ready reserve, twice over for bench/kv's session table.
max=0
for t in $(echo "$tokens" | tr , ' '); do [ "$t" -gt "$max" ] && max=$t; done
need=$((max * 144 / 2048 + 256))
[ "$need" -lt 2304 ] && need=2304
knob_stale
trap knob_restore EXIT
trap 'exit 130' INT TERM
trap 'exit 129' HUP
trap 'exit 141' PIPE
if ! knob_hugepages "$need"; then
	echo "$cli_name: $knob_why: nothing to measure" >&2
	exit 77
fi
free=$knob_hp_free
echo "CPU: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "huge pages: $free free of $(cat "$knob") reserved"
"$build/bench/hugewarm"
# The reservation set compaction going (knob.sh, knob_kthread_ticks):
# measure once it is done.
if ! knob_quiet 30; then
	echo "(kcompactd or khugepaged still busy after 30 s: measuring anyway)"
elif [ "$knob_quiet_s" -gt 0 ]; then
	echo "(waited ${knob_quiet_s} s for kcompactd and khugepaged to go idle)"
fi
mkdir -p "$out" || exit 1
status=0 logs=""
r=1
while [ $r -le "$rounds" ]; do
	for t in $(echo "$tokens" | tr , ' '); do
		echo
		echo "=== round $r: bench/kv --tokens $t --strategies $strategies, SPARSEBUF_HUGETLB=1${thp:+, SBBENCH_KV_THP=1}"
		log="$out/kv-$t-r$r.txt"
		logs="$logs $log"
		SPARSEBUF_HUGETLB=1 ${thp:+SBBENCH_KV_THP=1} \
			"$build/bench/kv" --tokens "$t" --strategies "$strategies" \
			--out "$out/kv-$t-r$r" >"$log" 2>&1
		rc=$?
		if [ $full = 1 ]; then
			grep -v '^sparsebuf: warning' "$log"
		else
			grep -v '^sparsebuf: warning' "$log" | sed -n '/^growth on the decode thread/,/^the work of growing/p' | sed '$d'
			grep -E '^targets for|^  (worst stall|p99.9 stall|total growth|RSS growth|pool resident)' "$log"
		fi
		[ $rc -eq 0 ] || { echo "(bench/kv exit status $rc; its output: $log)"; status=3; }
	done
	if [ $place = 1 ]; then
		echo
		echo "=== round $r: bench/place, SPARSEBUF_HUGETLB=1"
		logs="$logs $out/place-r$r.txt"
		SPARSEBUF_HUGETLB=1 "$build/bench/place" --rounds 1 >"$out/place-r$r.txt" 2>&1 || status=3
		grep -E 'placement:|kernel demand paging \(|explicit sb_buf_map|demand \(fault\)|anonymous memory|placed pages' "$out/place-r$r.txt"
	fi
	r=$((r + 1))
done
# shellcheck disable=SC2086
grep -q 'FAIL' $logs 2>/dev/null && status=3
exit $status
