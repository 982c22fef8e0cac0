# Shared by bench/perf-faults.sh and bench/pagein-perf.sh (sourced, not
# run): checks, a scratch directory, the probe bookkeeping, and the helpers
# that read perf stat's CSV and a workload's key=value output.

# perf_setup BIN: BIN built, perf installed (else exit 77), $tmp made and
# removed on exit with the probes, stale probes of an older build dropped.
perf_setup() {
	[ -x "$1" ] || { echo "build $1 first (make $1)" >&2; exit 2; }
	command -v perf >/dev/null 2>&1 || {
		echo "perf is not installed (Debian: apt-get install linux-perf)" >&2
		exit 77
	}
	tmp=$(mktemp -d)
	trap 'perf probe -q -d "sdt_sparsebuf:*" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
	# perf learns the probes from the binary's .note.stapsdt section;
	# drop any left from an older build first (their offsets would be
	# stale).
	perf probe -q -d "sdt_sparsebuf:*" >/dev/null 2>&1
	perf buildid-cache --add "$1" >/dev/null 2>&1
}

count() { # file event: a count from perf stat -x,
	awk -F, -v ev="$2" '$3 == ev { print $1 }' "$1"
}
val() { # name key: a value the workload printed as key=value
	sed -n "s/^$2=//p" "$tmp/$1.out"
}

# row LABEL PERF OURS: a line of the table, "yes" when they are equal;
# any "no" sets fail=1. ROW_W is the label's width.
fail=0
ROW_W=${ROW_W:-42}
row() {
	ok=no
	[ "$2" = "$3" ] && ok=yes
	[ "$ok" = no ] && fail=1
	printf "%-${ROW_W}s %10s %10s   %s\n" "$1" "$2" "$3" "$ok"
}
