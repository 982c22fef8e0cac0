#!/bin/sh
# Make sure the Debian build dependencies are installed. As root, install
# what is missing; otherwise print the exact command and fail.
# Usage: scripts/deps.sh [extra-package ...]
set -u
pkgs="gcc make pkg-config liburing-dev libnuma-dev systemtap-sdt-dev $*"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
[ -z "$missing" ] && exit 0
cmd="apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" -ne 0 ]; then
	echo "sparsebuf: missing build dependencies:$missing" >&2
	echo "sparsebuf: run as root:  $cmd" >&2
	exit 1
fi
echo "sparsebuf: installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$cmd >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && $cmd >/dev/null; } || {
	echo "sparsebuf: '$cmd' failed" >&2
	exit 1
}
