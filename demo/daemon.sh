#!/bin/sh
# make demo, step 8: sparsebufd, one memory budget for several processes.
#   demo/daemon.sh BUILD_DIR
set -eu
build=${1:-build}
. "$(dirname "$0")/../scripts/knob.sh"
dir=$(mktemp -d "${TMPDIR:-/tmp}/sbdemo-daemon.XXXXXX")
sock=$dir/sock
ctl() { "$build/bin/sparsebufctl" -s "$sock" status | sed 's/^/   | /'; }
# The shared prompt on huge pages where they can be reserved for the run
# (root), as step 6's growth: a process that maps the cached prompt then
# fills a page-directory entry per 2 MiB, not a page-table entry per 4
# KiB, which a host that shadows page tables makes cost microseconds each
# (docs/daemon.md, "Huge pages"). The setting goes back at the end.
knob_stale
huge=""
daemon=""
trap 'if [ -n "$daemon" ]; then kill $daemon 2>/dev/null || true; fi; rm -rf "$dir"; knob_restore' EXIT
if [ -w /proc/sys/vm/nr_hugepages ] && knob_hugepages 256 >/dev/null 2>&1; then
	huge=--hugetlb
	# Each taken once: a reserved page's first use on a VM is the
	# host's first backing of it (bench/hugetlb.sh does the same).
	"$build/bench/hugewarm" >/dev/null
fi
"$build/bin/sparsebufd" --socket "$sock" --max-bytes 256M --foreground \
	$huge 2>"$dir/log" &
daemon=$!
"$build/bin/sparsebufctl" -s "$sock" wait
echo "   sparsebufd: a 256 MiB budget for every process on the machine"
# A: a session that goes idle, its KV evictable.
"$build/bench/daemon" --client "$sock" --mib 160 --evictable >"$dir/a" &
a=$!
while ! grep -q placed "$dir/a"; do sleep 0.05; done
cat "$dir/a"
ctl
echo "   B needs 160 MiB too: the daemon takes them from idle A (to disk)"
"$build/bench/daemon" --client "$sock" --mib 160 >"$dir/b" &
b=$!
while ! grep -q -e placed -e refused "$dir/b"; do sleep 0.05; done
cat "$dir/b"
ctl
echo "   B killed with SIGKILL: its pages back in the budget"
kill -9 $b
wait $b 2>/dev/null || true
sleep 0.2
ctl
kill $a
wait $a || true
tail -n +2 "$dir/a"
echo "   one system prompt, three processes: the first computes it and puts it in"
echo "   the machine-wide cache, the others find it and map the same pages"
if [ -n "$huge" ]; then
	echo "   (on 2 MiB huge pages, reserved for this run: sparsebufd --hugetlb," \
		"SB_POOL_HUGETLB clients)"
else
	echo "   (huge pages cannot be reserved here: 256 KiB shmem pages)"
fi
"$build/bench/daemon" --prompts 3 --layers 8 \
	--client "$sock" $huge \
	--prompt-tokens 1024 | sed 's/^/   /'
"$build/bin/sparsebufctl" -s "$sock" cache | sed 's/^/   | /'
kill $daemon
wait $daemon
echo "   sparsebufd stopped"
