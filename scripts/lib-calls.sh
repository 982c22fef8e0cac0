#!/bin/sh
# The call graph between lib/'s files, from nm of their objects: one line
# "caller callee symbol..." per pair of files.
#   scripts/lib-calls.sh [BUILD_DIR]
set -eu
build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for o in "$build"/obj/lib/*.o; do
	f=$(basename "$o" .o)
	nm "$o" | awk '$1 == "U" { print $2 }' | grep -E '^sbi?_' | sort -u >"$tmp/$f.u" || true
	nm "$o" | awk 'NF == 3 && $2 ~ /^[TDBRCV]$/ { print $3 }' | grep -E '^sbi?_' | sort -u >"$tmp/$f.d" || true
done
for u in "$tmp"/*.u; do
	f=$(basename "$u" .u)
	for d in "$tmp"/*.d; do
		g=$(basename "$d" .d)
		[ "$f" = "$g" ] && continue
		s=$(comm -12 "$u" "$d" | tr '\n' ' ')
		[ -n "$s" ] && echo "$f $g $s"
	done
done
