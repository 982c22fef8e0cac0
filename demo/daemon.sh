#!/bin/sh
# make demo, step 8: sparsebufd, one memory budget for several processes.
#   demo/daemon.sh BUILD_DIR
set -eu
build=${1:-build}
dir=$(mktemp -d "${TMPDIR:-/tmp}/sbdemo-daemon.XXXXXX")
sock=$dir/sock
ctl() { "$build/bin/sparsebufctl" -s "$sock" status | sed 's/^/   | /'; }
"$build/bin/sparsebufd" --socket "$sock" --max-bytes 256M --foreground \
	2>"$dir/log" &
daemon=$!
trap 'kill $daemon 2>/dev/null || true; rm -rf "$dir"' EXIT
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
"$build/bench/daemon" --prompts 3 --layers 8 \
	--client "$sock" \
	--prompt-tokens 1024 | sed 's/^/   /'
"$build/bin/sparsebufctl" -s "$sock" cache | sed 's/^/   | /'
kill $daemon
wait $daemon
echo "   sparsebufd stopped"
