# Shared by the bench/*.sh scripts (sourced, not run): the command-line
# convention of every program here (common/cli.h). --help prints the
# script's usage to stdout and exits 0; --version prints its name and the
# library's version; an unknown option or a bad value is refused with a
# message naming it, exit status 2.
#
# Set cli_name (the script's name) and define usage() (its help, on
# stdout) before using these.

cli_lib_dir=$(dirname "$0")

# The library's version, from the public header next to these scripts.
cli_version() {
	h="$cli_lib_dir/../lib/include/sparsebuf.h"
	v=$(sed -n 's/^#define SPARSEBUF_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$h" 2>/dev/null | paste -sd. -)
	echo "$cli_name (sparsebuf) ${v:-unknown}"
}

# cli_fail MESSAGE...: a usage error.
cli_fail() {
	echo "$cli_name: $* ($cli_name --help lists the options)" >&2
	exit 2
}

# cli_std ARG: answer --help and --version; refuse any other option.
cli_std() {
	case $1 in
	--help | -h) usage; exit 0 ;;
	--version) cli_version; exit 0 ;;
	-*) cli_fail "unknown option '$1'" ;;
	esac
}

# cli_need OPT NARGS: OPT's value is there (NARGS: the arguments left,
# the option included).
cli_need() {
	[ "$2" -ge 2 ] || cli_fail "option $1 needs a value"
}

# cli_uint OPT VALUE [MAX]: VALUE is a whole number (at most MAX).
cli_uint() {
	case $2 in
	'' | *[!0-9]*) cli_fail "$1: '$2' is not a non-negative integer" ;;
	esac
	[ ${#2} -le 18 ] || cli_fail "$1: '$2' is out of range"
	[ -z "${3:-}" ] || [ "$2" -le "$3" ] ||
		cli_fail "$1: '$2' is out of range (0 to $3)"
}

# cli_size OPT VALUE: a size as the programs take it (4096, 64M, 4.5G).
cli_size() {
	printf '%s\n' "$2" | grep -Eq '^[0-9]+(\.[0-9]+)?([KMGTkmgt][iI]?)?[bB]?$' ||
		cli_fail "$1: '$2' is not a size (e.g. 4096, 512M, 4.5G)"
}

# cli_fraction OPT VALUE: a number in (0, 1].
cli_fraction() {
	printf '%s\n' "$2" | grep -Eq '^(0?\.[0-9]+|[01](\.[0-9]*)?)$' &&
		awk "BEGIN { exit !($2 > 0 && $2 <= 1) }" ||
		cli_fail "$1: '$2' is not a number in (0, 1]"
}
