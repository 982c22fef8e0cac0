#!/bin/sh
# Make sure the Debian build dependencies are installed. As root, install
# what is missing; otherwise print the exact command and fail.
# Usage: scripts/deps.sh [extra-package ...] [--optional package ...]
#        scripts/deps.sh --check    (plain make: install nothing, on any
#                                    distribution; look for the headers
#                                    and libraries the build needs)
set -u
if [ "${1:-}" = "--check" ]; then
	ok=1
	for h in liburing.h numa.h; do
		printf '#include <%s>\n' "$h" | ${CC:-cc} -E -x c - >/dev/null 2>&1 || {
			echo "sparsebuf: <$h> not found" >&2
			ok=0
		}
	done
	for l in uring numa; do
		printf 'int main(void){return 0;}\n' |
			${CC:-cc} -x c - -o /dev/null "-l$l" >/dev/null 2>&1 || {
			echo "sparsebuf: -l$l not found" >&2
			ok=0
		}
	done
	[ "$ok" = 1 ] && exit 0
	echo "sparsebuf: install liburing and libnuma with their headers (Debian:" \
		"apt-get install -y liburing-dev libnuma-dev systemtap-sdt-dev;" \
		"'make test' and 'make demo' do it when run as root)" >&2
	exit 1
fi
# Packages after --optional are installed when root and otherwise only
# named: the tests that need them skip, saying why.
req="gcc make pkg-config liburing-dev libnuma-dev systemtap-sdt-dev"
opt=""
for a in "$@"; do
	case $a in
	--optional) optional=1 ;;
	*) if [ "${optional:-0}" = 1 ]; then opt="$opt $a"; else req="$req $a"; fi ;;
	esac
done
missing_of() {
	m=""
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
			m="$m $p"
	done
	echo "$m"
}
missing=$(missing_of $req)
missing_opt=$(missing_of $opt)
if [ "$(id -u)" -ne 0 ]; then
	if [ -n "$missing_opt" ]; then
		echo "sparsebuf: optional (some tests skip without them):$missing_opt" >&2
		echo "sparsebuf: as root:  apt-get install -y --no-install-recommends$missing_opt" >&2
	fi
	[ -z "$missing" ] && exit 0
	echo "sparsebuf: missing build dependencies:$missing" >&2
	echo "sparsebuf: run as root:  apt-get install -y --no-install-recommends$missing" >&2
	exit 1
fi
missing="$missing$missing_opt"
[ -z "$missing" ] && exit 0
cmd="apt-get install -y --no-install-recommends$missing"
echo "sparsebuf: installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$cmd >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && $cmd >/dev/null; } || {
	if [ -n "$missing_opt" ] && [ "$(missing_of $req)" = "" ]; then
		echo "sparsebuf: could not install$missing_opt (optional: some tests skip)" >&2
		exit 0
	fi
	echo "sparsebuf: '$cmd' failed" >&2
	exit 1
}
