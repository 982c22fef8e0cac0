#!/bin/sh
# Check lib/'s layering (lib/LAYERS) against the calls nm sees between its
# objects: every file is in a layer, no call goes to a higher layer, and
# there is no loop of calls between files. Exit 1 with what is wrong.
#   scripts/layers.sh [BUILD_DIR]
set -eu
build=${1:-build}
here=$(dirname "$0")
[ -n "$(ls "$build"/obj/lib/*.o 2>/dev/null)" ] || {
	echo "layers: no objects in $build/obj/lib (build first)" >&2
	exit 1
}
calls=$(mktemp)
trap 'rm -f "$calls"' EXIT
"$here/lib-calls.sh" "$build" >"$calls"
ls "$build"/obj/lib/*.o | sed 's|.*/||; s|\.o$||' |
awk -v layers="$here/../lib/LAYERS" -v calls="$calls" '
function visit(v,    k, w) {
	state[v] = 1
	stack[++sp] = v
	for (k = 1; k <= nout[v]; k++) {
		w = out[v, k]
		if (state[w] == 1) {
			loop = w
			for (i = sp; i >= 1 && stack[i] != w; i--)
				loop = stack[i] " -> " loop
			printf "layers: a loop of calls: %s -> %s\n", w, loop
			bad = 1
		} else if (!state[w]) {
			visit(w)
		}
	}
	sp--
	state[v] = 2
}
BEGIN {
	n = 0
	while ((getline line < layers) > 0) {
		if (line ~ /^#/ || line ~ /^[ \t]*$/)
			continue
		split(line, f, /[ \t]+/)
		n++
		name[n] = f[1]
		for (i = 2; i in f; i++)
			layer[f[i]] = n
		delete f
	}
}
{ files[$1] = 1 }
END {
	for (x in files)
		if (!(x in layer)) {
			printf "layers: lib/%s.c is in no layer of lib/LAYERS\n", x
			bad = 1
		}
	while ((getline line < calls) > 0) {
		split(line, f, " ")
		a = f[1]; b = f[2]
		out[a, ++nout[a]] = b
		if ((a in layer) && (b in layer) && layer[b] > layer[a]) {
			syms = ""
			for (i = 3; i in f; i++)
				syms = syms " " f[i]
			printf "layers: %s (%s) calls up into %s (%s):%s\n", a,
			       name[layer[a]], b, name[layer[b]], syms
			bad = 1
		}
		delete f
	}
	for (x in files)
		if (!state[x])
			visit(x)
	if (bad)
		exit 1
	c = 0
	for (x in files)
		c++
	printf "layers: %d files in %d layers, every call downward or within a layer, no loop\n", c, n
}'
