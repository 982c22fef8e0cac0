#!/bin/sh
# LLM in a flash on this machine: one generated model larger than its
# memory budget, four ways of running it under that budget.
#
#   bench/flash.sh [--model-bytes N] [--budget-fraction F] [--steps S]
#                  [-k K] [--threads T] [--seed S] [--build DIR]
#                  [--out DIR] [--perf] [--json]
#   bench/flash.sh --help | --version
#
# Generates the model if needed (cached as BUILD/flash/model-N-sSEED.bin),
# then runs sbflash in each mode, each cold (the file's page cache dropped
# first) and, when root with a writable cgroup v1 memory controller, in a
# fresh cgroup whose limit is the budget (which charges the page cache
# too); otherwise only sbflash's own pool budget applies (said on stderr).
#
#   resident     every weight in memory: the upper bound; null in the
#                JSON when the model does not fit the budget (it is then
#                still run without the limit, when RAM allows, so that its
#                logits can be compared)
#   mmap_dense   mmap the checkpoint, compute every neuron (the naive way)
#   mmap_sparse  mmap the checkpoint, compute the predicted neurons
#   sparsebuf    FFN bundles prefetched into a sparsebuf file buffer
#
# outputs_match: the logits of sparsebuf, mmap_sparse and resident (same
# neurons, same kernels) are bit-identical (cmp). peak_rss_bytes is the
# cgroup's memory.max_usage_in_bytes (every byte charged: anonymous,
# memfd and page cache) when a cgroup is used, else VmHWM.
#
# --perf also runs each mode under perf stat -e page-faults,minor-faults,
# major-faults (a second run, on stderr). Without --json: a table and a
# chart (OUT/flash.png). With --json the last line of stdout is one JSON
# object (see docs/flash.md).
set -u
cli_name=flash.sh
usage() {
	cat <<EOT
usage: bench/flash.sh [options]

LLM in a flash on this machine: a generated model (sbgen, cached under
BUILD/flash) larger than its memory budget, run four ways under that budget
(resident, mmap_dense, mmap_sparse, sparsebuf); a table, the targets and a
chart, or one JSON object (docs/flash.md).

options:
  --model-bytes SIZE       the model's size (default 1G; 4.5G is fine)
  --budget-fraction F      the budget, a fraction of the model in (0, 1]
                           (default 0.5)
  --steps S                tokens per run (default 16)
  -k K                     sbflash's window (default 5)
  --threads T              kernel threads, 0: one per CPU (default 0)
  --seed S                 the model's and the tokens' seed (default 1)
  --build DIR              where sbgen and sbflash are (default build)
  --out DIR                logits, data and chart (default BUILD/bench-flash)
  --perf                   also count faults under perf stat (stderr)
  --json                   one JSON object as the last line of stdout
  --help                   print this help and exit
  --version                print the version and exit
EOT
}
. "$(dirname "$0")/cli-lib.sh"
. "$(dirname "$0")/../scripts/knob.sh"
bytes=1G frac=0.5 steps=16 k=5 threads=0 seed=1 build=build out= json=0
perf=0
while [ $# -gt 0 ]; do
	case $1 in
	--model-bytes | --budget-fraction | --steps | -k | --threads | --seed | \
	--build | --out)
		cli_need "$1" $# ;;
	esac
	case $1 in
	--model-bytes) cli_size "$1" "$2"; bytes=$2; shift ;;
	--budget-fraction) cli_fraction "$1" "$2"; frac=$2; shift ;;
	--steps) cli_uint "$1" "$2" 1048576; steps=$2; shift ;;
	-k) cli_uint "$1" "$2" 1048576; k=$2; shift ;;
	--threads) cli_uint "$1" "$2" 256; threads=$2; shift ;;
	--seed) cli_uint "$1" "$2"; seed=$2; shift ;;
	--build) build=$2; shift ;;
	--out) out=$2; shift ;;
	--perf) perf=1 ;;
	--json) json=1 ;;
	*) cli_std "$1"; cli_fail "unexpected argument '$1'" ;;
	esac
	shift
done
[ "$steps" -ge 1 ] || cli_fail "--steps: '$steps' is out of range (1 to 1048576)"
[ "$k" -ge 1 ] || cli_fail "-k: '$k' is out of range (1 to 1048576)"
out=${out:-$build/bench-flash}
mkdir -p "$build/flash" "$out"
say() { echo "$*" >&2; }
# A field of a flat JSON object: jget JSON KEY
jget() { printf '%s\n' "$1" | sed -n "s/.*\"$2\": \([^,}]*\).*/\1/p"; }

for b in sbgen sbflash; do
	[ -x "$build/bin/$b" ] || { say "bench/flash.sh: $build/bin/$b missing (make)"; exit 1; }
done
model="$build/flash/model-$bytes-s$seed.bin"
if ! "$build/bin/sbgen" --info "$model" >/dev/null 2>&1; then
	say "generating $model ..."
	t0=$(date +%s)
	"$build/bin/sbgen" "$model" --model-bytes "$bytes" --seed "$seed" >&2 || exit 1
	say "  generated in $(($(date +%s) - t0)) s"
fi
info=$("$build/bin/sbgen" --info "$model" --json)
model_bytes=$(jget "$info" model_bytes)
ffn_bytes=$(jget "$info" ffn_bytes)
recall=$(jget "$info" predictor_recall)
budget=$(awk "BEGIN { printf \"%.0f\", $model_bytes * $frac }")
say "model $model: $(awk "BEGIN { printf \"%.2f\", $model_bytes / 2^30 }") GiB" \
	"(FFN $(awk "BEGIN { printf \"%.2f\", $ffn_bytes / 2^30 }") GiB)," \
	"budget $(awk "BEGIN { printf \"%.2f\", $budget / 2^30 }") GiB, $steps steps, k=$k"

# The cgroup v1 memory controller, when we may use it.
cgroot=/sys/fs/cgroup/memory
use_cg=0
if [ "$(id -u)" = 0 ] && [ -w "$cgroot" ] && [ -e "$cgroot/cgroup.procs" ]; then
	use_cg=1
else
	say "no writable cgroup v1 memory controller: the budget binds only" \
		"sparsebuf's pool (the baselines' page cache is not limited)"
fi
# What a run killed by kill -9 (no trap sees it) left: its cgroups, named
# sbflash-PID-START-MODE (START, the script's start time, tells a reused
# PID apart), the sbflash it was waiting for still running in one, a
# raised vm.max_map_count (scripts/knob.sh puts that back).
knob_stale
me="$$-$(knob_start $$)"
if [ $use_cg = 1 ]; then
	for c in "$cgroot"/sbflash-*; do
		[ -d "$c" ] || continue
		p=${c#"$cgroot"/sbflash-}
		st=${p#*-}
		p=${p%%-*} st=${st%%-*}
		[ -n "$st" ] && [ "$(knob_start "$p")" = "$st" ] &&
			continue	# a run going on
		left=$(cat "$c/cgroup.procs" 2>/dev/null | tr '\n' ' ')
		if [ -n "$left" ]; then
			say "a killed run's $(cat /proc/${left%% *}/comm 2>/dev/null) is still running in $c (pid ${left% }): killing it"
			kill -9 $left 2>/dev/null
			i=0
			# (cgroup files have no size: read them)
			while [ -n "$(cat "$c/cgroup.procs" 2>/dev/null)" ] &&
				[ $i -lt 50 ]; do
				sleep 0.1; i=$((i + 1))
			done
		fi
		if rmdir "$c" 2>/dev/null; then
			say "removed $c, left by a killed run"
		else
			say "cannot remove $c, left by a killed run"
		fi
	done
fi
cgs=""
cleanup() {
	knob_restore
	for c in $cgs; do [ -d "$c" ] && rmdir "$c" 2>/dev/null; done
}
trap cleanup EXIT
# (PIPE: a reader of the output gone, as with | head, ends the run
# through the trap rather than kill it.)
trap 'exit 130' INT TERM
trap 'exit 129' HUP
trap 'exit 141' PIPE
# Scattered FFN pages are one kernel mapping each (two with the gaps):
# make room for the window's bundles when we may. Held for the run (a
# run beside this one that raised it further keeps it raised until both
# end).
need=$(awk "BEGIN { printf \"%.0f\", 3 * $budget / 4096 + 65536 }")
old_maps=$(cat /proc/sys/vm/max_map_count)
if [ -w /proc/sys/vm/max_map_count ] &&
	knob_set /proc/sys/vm/max_map_count "$need" raise; then
	[ $knob_changed = 1 ] && say "vm.max_map_count $old_maps -> $need for this run"
elif [ "$old_maps" -lt "$need" ]; then
	say "vm.max_map_count is $old_maps: sparsebuf may run out of mappings"
fi

progress=--no-progress
[ -t 2 ] && progress=--progress
cold() { dd if="$model" iflag=nocache count=0 status=none 2>/dev/null || true; }

# sbflash's options for a mode of this table: sparsebuf_whole is sparsebuf
# reading whole bundles before attention (the default reads up rows before
# it and the down columns of the neurons that fire after it).
mode_args() {
	case $1 in
	sparsebuf_whole) echo "--mode flash --whole-bundles" ;;
	*) echo "--mode $1" ;;
	esac
}

# run MODE LIMIT(0: none) [perf]: one sbflash run; sets $res (its JSON)
# and $peak.
# The host's steal time so far, in clock ticks (/proc/stat): a VM's
# neighbours take CPU from every mode alike only on average; each mode's
# line says how much it lost.
steal_ticks() { awk '/^cpu / { print $9; exit }' /proc/stat 2>/dev/null || echo 0; }
run() {
	mode=$1 limit=$2
	logits="$out/logits-$mode.bin"
	rm -f "$logits"	# a failed run leaves none, not the last run's
	cold
	steal0=$(steal_ticks)
	set -- "$build/bin/sbflash" "$model" $(mode_args "$mode") --budget "$budget" \
		-k "$k" --steps "$steps" --seed "$seed" --threads "$threads" \
		--logits "$logits" --json $progress
	if [ "$limit" != 0 ] && [ $use_cg = 1 ]; then
		cg="$cgroot/sbflash-$me-$mode"
		mkdir -p "$cg" && cgs="$cgs $cg"
		echo "$limit" > "$cg/memory.limit_in_bytes"
		res=$(sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@" | tail -n 1)
		peak=$(cat "$cg/memory.max_usage_in_bytes")
		failcnt=$(cat "$cg/memory.failcnt")
		rmdir "$cg" 2>/dev/null
	else
		res=$("$@" | tail -n 1)
		peak=$(jget "$res" peak_rss_bytes)
		failcnt=0
	fi
	case $res in
	\{*) ;;
	*) say "$mode: failed"; res="" ;;
	esac
	steal=$(awk "BEGIN { printf \"%.2f\", ($(steal_ticks) - $steal0) / $(getconf CLK_TCK) }")
}

# perf_run MODE LIMIT: fault counts of a whole run (loading included)
# under perf stat, in a cgroup of its own like the measured run.
perf_run() {
	mode=$1 limit=$2
	cold
	set -- perf stat -x, -e page-faults,minor-faults,major-faults \
		"$build/bin/sbflash" "$model" $(mode_args "$mode") --budget "$budget" \
		-k "$k" --steps "$steps" --seed "$seed" --threads "$threads" \
		--no-progress --json
	if [ "$limit" != 0 ] && [ $use_cg = 1 ]; then
		cg="$cgroot/sbflash-$me-perf-$mode"
		mkdir -p "$cg" && cgs="$cgs $cg"
		echo "$limit" > "$cg/memory.limit_in_bytes"
		set -- sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"
	fi
	pf=$("$@" 2>&1 >/dev/null | awk -F, '
		/page-faults/ { p = $1 } /minor-faults/ { mi = $1 }
		/major-faults/ { ma = $1 }
		END { printf "page-faults %s, minor %s, major %s", p, mi, ma }')
	[ "$limit" != 0 ] && [ $use_cg = 1 ] && rmdir "$cg" 2>/dev/null
	say "perf stat $mode (whole run, loading included): $pf"
}

avail=$(awk '/MemAvailable/ { print $2 * 1024 }' /proc/meminfo)
json_modes=""
for mode in resident mmap_dense mmap_sparse sparsebuf sparsebuf_whole; do
	limit=$budget
	fits=1
	if [ $mode = resident ]; then
		# The whole model, its KV cache and the runtime must fit.
		if awk "BEGIN { exit !($model_bytes + 160 * 2^20 > $budget) }"; then
			fits=0 limit=0
			if awk "BEGIN { exit !($model_bytes * 2 > $avail) }"; then
				say "resident: does not fit the budget or RAM: skipped"
				json_modes="$json_modes\"resident\": null, "
				rm -f "$out/logits-resident.bin"
				continue
			fi
			say "resident: does not fit the budget; run without it, for its logits only"
		fi
	fi
	say "== $mode"
	run $mode $limit
	if [ -z "$res" ]; then
		json_modes="$json_modes\"$mode\": null, "
		eval "r_$mode=''"
		continue
	fi
	[ "$failcnt" != 0 ] && say "  (cgroup limit hit $failcnt times: reclaim)"
	tps=$(jget "$res" tokens_per_s)
	brt=$(jget "$res" bytes_read_per_token)
	flt=$(jget "$res" faults)
	newb=$(jget "$res" new_bytes_per_token)
	# (0 when an older sbflash does not say: no CPU line then)
	cpt=$(jget "$res" cpu_s_per_token)
	cpt=${cpt:-0}
	ncpu=$(jget "$res" cpus)
	ncpu=${ncpu:-0}
	eval "tps_$mode=$tps brt_$mode=$brt flt_$mode=$flt peak_$mode=$peak new_$mode=$newb cpt_$mode=$cpt cpus_$mode=$ncpu"
	[ $mode = sparsebuf ] && unit_sparsebuf=$(jget "$res" read_unit_bytes)
	say "  $tps tokens/s, $(awk "BEGIN { printf \"%.1f\", $brt / 2^20 }") MiB read/token," \
		"$flt faults, peak $(awk "BEGIN { printf \"%.0f\", $peak / 2^20 }") MiB" \
		"(budget $(awk "BEGIN { printf \"%.0f\", $budget / 2^20 }") MiB); host steal $steal s$(
		[ "$cpt" = 0 ] || awk "BEGIN { printf \"; CPU %.1f ms/token\", $cpt * 1e3 }")"
	if [ $fits = 0 ]; then
		json_modes="$json_modes\"resident\": null, "
		over_resident="(no-limit)"
	else
		json_modes="$json_modes\"$mode\": {\"tokens_per_s\": $tps, \"bytes_read_per_token\": $brt, \"peak_rss_bytes\": $peak, \"faults\": $flt, \"cpu_s_per_token\": $([ "$cpt" = 0 ] && echo null || echo "$cpt")}, "
	fi
	[ $perf = 1 ] && command -v perf >/dev/null && perf_run $mode $limit
done
json_modes=${json_modes%, }

# The predictor's recall on this run's tokens (every neuron computed once
# more, in a separate short resident run, so resident's timing is clean);
# the generator's estimate on sampled inputs when resident cannot run.
if [ -s "$out/logits-resident.bin" ]; then
	m=$("$build/bin/sbflash" "$model" --mode resident --measure --steps "$steps" \
		--seed "$seed" --threads "$threads" --no-progress --json | tail -n 1)
	r=$(jget "$m" recall)
	case $r in
	null | "") ;;
	*) say "predictor recall on this run: $r (sbgen's estimate on sampled inputs: $recall)"; recall=$r ;;
	esac
fi

# The disk's random-read rate at sparsebuf's read size and queue depth (its
# I/O ring holds 256 requests; one layer's reads go in one submission),
# on the model file, cold, for the read-rate target.
fio_bps="" fio_desc=""
if command -v fio >/dev/null && [ -n "${unit_sparsebuf:-}" ]; then
	cold
	fio_bw=$(fio --name=flash --filename="$model" --readonly --rw=randread \
		--bs="$unit_sparsebuf" --iodepth=256 --ioengine=io_uring --direct=1 \
		--runtime=5 --time_based --output-format=terse --terse-version=3 \
		2>/dev/null | awk -F';' 'NR == 1 { print $7 }')
	case $fio_bw in
	'' | *[!0-9]*) say "fio failed: no read-rate comparison" ;;
	0) say "fio read nothing: no read-rate comparison" ;;
	*) fio_bps=$((fio_bw * 1024)) fio_desc="$((unit_sparsebuf / 1024)) KiB x256"
	   say "fio randread $fio_desc on the model: $((fio_bps / 1000000)) MB/s" ;;
	esac
fi

match=true
ref="$out/logits-sparsebuf.bin"
if [ -s "$ref" ] && [ -n "${tps_sparsebuf:-}" ]; then
	for m in mmap_sparse resident sparsebuf_whole; do
		[ -s "$out/logits-$m.bin" ] || continue
		cmp -s "$ref" "$out/logits-$m.bin" || { match=false; say "logits of $m differ from sparsebuf"; }
	done
else
	match=false
	say "sparsebuf failed: no logits to compare"
fi

# The table, the targets and the chart (on stderr with --json).
report() {
v() { eval "echo \${$1_$2:-}"; }
printf '\n%-16s %12s %10s %16s %12s %14s\n' mode tokens/s "vs dense" "MiB read/token" faults "peak MiB" 
dat="$out/flash.dat"
: > "$dat"
i=0
for m in resident mmap_dense mmap_sparse sparsebuf sparsebuf_whole; do
	tps=$(v tps $m)
	[ -n "$tps" ] || { printf '%-16s %12s\n' $m "n/a"; continue; }
	ratio=$(awk "BEGIN { d = \"$(v tps mmap_dense)\" + 0; printf \"%.2fx\", (d > 0 ? $tps / d : 0) }")
	printf '%-16s %12.3f %10s %16.1f %12s %14.0f %s\n' $m "$tps" "$ratio" \
		"$(awk "BEGIN { print $(v brt $m) / 2^20 }")" "$(v flt $m)" \
		"$(awk "BEGIN { print $(v peak $m) / 2^20 }")" "$(v over $m)"
	echo "$i $m $tps $(awk "BEGIN { print $(v brt $m) / 2^20 }")" >> "$dat"
	i=$((i + 1))
done
echo
target() { printf '  %-58s %s\n' "$1" "$2"; }
if [ -n "$(v tps sparsebuf)" ] && [ -n "$(v tps mmap_dense)" ] && [ -n "$(v tps mmap_sparse)" ]; then
	r1=$(awk "BEGIN { printf \"%.2f\", $tps_sparsebuf / $tps_mmap_dense }")
	r2=$(awk "BEGIN { printf \"%.2f\", $tps_sparsebuf / $tps_mmap_sparse }")
	target "sparsebuf >= 4x mmap_dense tokens/s: ${r1}x" "$(awk "BEGIN { print ($r1 >= 4) ? \"PASS\" : \"FAIL\" }")"
	target "sparsebuf >= 1.5x mmap_sparse tokens/s: ${r2}x" "$(awk "BEGIN { print ($r2 >= 1.5) ? \"PASS\" : \"FAIL\" }")"
	rb=$(awk "BEGIN { printf \"%.2f\", ($new_sparsebuf > 0 ? $brt_sparsebuf / $new_sparsebuf : 0) }")
	target "bytes read/token <= 2x new window bytes/token: ${rb}x" "$(awk "BEGIN { print ($rb <= 2) ? \"PASS\" : \"FAIL\" }")"
	rs=$(awk "BEGIN { printf \"%.2f\", ($brt_mmap_sparse > 0 ? $brt_sparsebuf / $brt_mmap_sparse : 0) }")
	target "bytes read/token <= mmap_sparse's: ${rs}x" "$(awk "BEGIN { print ($rs <= 1) ? \"PASS\" : \"FAIL\" }")"
	target "sparsebuf peak $(awk "BEGIN { printf \"%.0f\", $peak_sparsebuf / 2^20 }") MiB within budget $(awk "BEGIN { printf \"%.0f\", $budget / 2^20 }") MiB" \
		"$(awk "BEGIN { print ($peak_sparsebuf <= $budget) ? \"PASS\" : \"FAIL\" }")"
	if [ -n "$fio_bps" ]; then
		rate=$(awk "BEGIN { printf \"%.0f\", $brt_sparsebuf * $tps_sparsebuf / 1e6 }")
		rr=$(awk "BEGIN { printf \"%.2f\", ($fio_bps > 0 ? $rate * 1e6 / $fio_bps : 0) }")
		target "read rate ${rate} MB/s >= 0.6x fio randread ${fio_desc} $(awk "BEGIN { printf \"%.0f\", $fio_bps / 1e6 }") MB/s: ${rr}x" \
			"$(awk "BEGIN { print ($rr >= 0.6) ? \"PASS\" : \"FAIL\" }")"
		# Whether the rate is the disk's or the CPUs': the rate the
		# runner's CPU time a token allows, every CPU busy and every
		# read overlapped (bench/pagecost says where that time goes;
		# the kernels' threads' spin-waits count as CPU too).
		awk "BEGIN { c = $cpt_sparsebuf; n = $cpus_sparsebuf;
			if (c <= 0 || n <= 0 || $fio_bps <= 0) exit
			t = n / c; r = t * $brt_sparsebuf / 1e6
			printf \"  (sparsebuf took %.0f ms of CPU a token on %d CPUs: at most %.1f tokens/s,\\n   %.0f MB/s, %.2fx fio, with every CPU busy)\\n\", c * 1e3, n, t, r, r * 1e6 / $fio_bps }"
	fi
fi
target "outputs_match (sparsebuf == whole == mmap_sparse == resident)" "$([ $match = true ] && echo PASS || echo FAIL)"
if command -v gnuplot >/dev/null; then
	gnuplot -e "dir='$out'" bench/flash.gp 2>/dev/null && echo "chart: $out/flash.png"
else
	echo "(no gnuplot: no chart)"
fi
}

if [ $json = 1 ]; then
	report >&2
	echo "{\"model_bytes\": $model_bytes, \"ffn_bytes\": $ffn_bytes, \"budget_bytes\": $budget, \"steps\": $steps, \"predictor_recall\": $recall, \"outputs_match\": $match, \"modes\": {$json_modes}}"
else
	report
fi
