#!/bin/sh
# Section 1 man pages from the tools' own --help (one source of truth, as
# help2man does): NAME from the first sentence of the description, SYNOPSIS
# from the usage lines, the rest as it prints.
#   scripts/mkman1.sh OUTDIR VERSION DATE TOOL...
set -eu
out=$1 version=$2 date=$3
shift 3
mkdir -p "$out"
for tool in "$@"; do
	name=$(basename "$tool")
	help=$("$tool" --help)
	upper=$(echo "$name" | tr 'a-z-' 'A-Z_')
	# The first sentence after the usage lines, for NAME.
	about=$(printf '%s\n' "$help" |
		awk 'f && NF { printf "%s ", $0; got = 1; next } got { exit } /^$/ { f = 1 }' |
		sed 's/\. .*//; s/[. ]*$//')
	{
		printf '.TH %s 1 "%s" "sparsebuf %s" "sparsebuf Manual"\n' "$upper" "$date" "$version"
		printf '.SH NAME\n%s \\- %s\n' "$name" "$(printf '%s' "$about" | sed 's/\\/\\e/g')"
		printf '.SH SYNOPSIS\n.nf\n'
		printf '%s\n' "$help" | awk '/^usage:/ { sub(/^usage: */, ""); print; next } /^       / && !done { sub(/^ +/, ""); print; next } { done = 1 }' |
			sed 's/\\/\\e/g; s/^[.'"'"']/\\\&&/'
		printf '.fi\n.SH DESCRIPTION\n.nf\n'
		printf '%s\n' "$help" | awk 'f { print } /^$/ && !f { f = 1 }' |
			sed 's/\\/\\e/g; s/^[.'"'"']/\\\&&/'
		printf '.fi\n.SH SEE ALSO\n\\fBsparsebuf\\fP(7)\n'
	} >"$out/$name.1"
done
