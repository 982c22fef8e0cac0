#!/bin/sh
# Huge folios in the heaps (issue 12's lever), both ways in one run:
# placement and a streaming read of placed pages (bench/place), and decode
# attention over a 32k-position cache in a sparsebuf buffer against the
# same cache in anonymous memory (bench/kernels_attn), with the system's
# shmem_enabled as it is and with within_size, alternately, R rounds.
#
#   bench/folios.sh [--rounds R] [--build DIR]
#   bench/folios.sh --help | --version
#
# sparsebuf never changes shmem_enabled (sparsebuf-info says what the
# heaps get); this benchmark sets it for its runs and puts it back, also
# on Ctrl-C. Where it cannot (not root, no transparent huge pages) it says
# so and exits 77.
set -u
cli_name=folios.sh
usage() {
	cat <<EOT
usage: bench/folios.sh [options]

Huge folios in sparsebuf's heaps (shmem_enabled=within_size) against the
system's setting, alternately: bench/place (placement, streaming read) and
bench/kernels_attn at 32768 positions (sparsebuf buffer and anonymous
memory), each round both ways.

options:
  --rounds R               rounds, 1 to 16 (default 3)
  --build DIR              where the benchmarks are (default build)
  --help                   print this help and exit
  --version                print the version and exit
EOT
}
. "$(dirname "$0")/cli-lib.sh"
. "$(dirname "$0")/../scripts/knob.sh"
rounds=3 build=build
while [ $# -gt 0 ]; do
	case $1 in
	--rounds | --build) cli_need "$1" $# ;;
	esac
	case $1 in
	--rounds) cli_uint "$1" "$2" 16; rounds=$2; shift ;;
	--build) build=$2; shift ;;
	*) cli_std "$1"; cli_fail "unexpected argument '$1'" ;;
	esac
	shift
done
[ "$rounds" -ge 1 ] || cli_fail "--rounds must be 1 to 16"
for b in place kernels_attn; do
	[ -x "$build/bench/$b" ] || { echo "$cli_name: $build/bench/$b missing (make)" >&2; exit 1; }
done
knob=/sys/kernel/mm/transparent_hugepage/shmem_enabled
if [ ! -w "$knob" ] || ! grep -q within_size "$knob"; then
	echo "$cli_name: $knob is not writable here or has no within_size" \
		"(root and transparent huge pages needed): nothing to compare" >&2
	exit 77
fi
knob_stale
was=$(knob_value "$knob")
[ "$was" = within_size ] && other=never || other=$was
# A kill -9 cannot be trapped: say how to put it back first (the next
# bench or test script that changes a setting does it too).
echo "(shmem_enabled is changed for each run; if this is killed, restore" \
	"it: echo $was > $knob)"
trap knob_restore EXIT
trap 'exit 130' INT TERM
trap 'exit 129' HUP
trap 'exit 141' PIPE
echo "CPU: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(date -u '+%Y-%m-%d %H:%M UTC')"
# The kernels' best variant here (they dispatch at run time the same way).
isa=scalar
grep -q avx2 /proc/cpuinfo && isa=avx2
grep -q avx512bw /proc/cpuinfo && isa=avx512
r=1
while [ $r -le "$rounds" ]; do
	for mode in "$other" within_size; do
		knob_set "$knob" "$mode" || exit 1
		echo
		echo "=== round $r, shmem_enabled=$mode ($("$build/bin/sparsebuf-info" 2>/dev/null |
			sed -n 's/^ *heap folios: *//p' | cut -c1-40))"
		"$build/bench/place" --rounds 1 |
			grep -E 'kernel demand paging \(|explicit sb_buf_map|demand \(fault\)|anonymous memory|placed pages|pwrite of a page'
		for backing in anon sparsebuf; do
			"$build/bench/kernels_attn" --ctx 32768 --dtype bf16 \
				--isa $isa --threads 2 --reps 5 --backing $backing 2>&1 |
				awk -v b=$backing '$1 == 32768 { printf "attention 32k, %-9s %s: head-major %s ms/token (+-%s%%)\n", b, $3, $11, $14 }'
		done
	done
	r=$((r + 1))
done
