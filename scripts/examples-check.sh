#!/bin/sh
# Install into a scratch prefix, build examples/ against that copy through
# pkg-config, as a user would, and run every example (CI runs this).
#   scripts/examples-check.sh [BUILD_DIR]
set -eu
build=${1:-build}
root=$(mktemp -d "${TMPDIR:-/tmp}/sbexamples.XXXXXX")
trap 'rm -rf "$root"' EXIT
prefix=/usr/local
make --no-print-directory install BUILD="$build" DESTDIR="$root" PREFIX="$prefix" >/dev/null
lib="$root$prefix/lib"
export PKG_CONFIG_PATH="$lib/pkgconfig"
# The .pc files name ${prefix}; --define-prefix finds it from where they lie.
export PKG_CONFIG="pkg-config --define-prefix"
cp examples/*.c examples/Makefile "$root/"
make --no-print-directory -C "$root" CC="${CC:-cc}" >/dev/null
cd "$root"
export LD_LIBRARY_PATH="$lib"
status=0
for e in kv_cache shared_prompt budget_evict save_restore file_weights; do
	if "./$e"; then
		:
	else
		echo "examples: $e failed" >&2
		status=1
	fi
done
[ "$status" = 0 ] && echo "examples: built against the installed copy through pkg-config, all ran"
exit $status
