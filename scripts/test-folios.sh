#!/bin/sh
# The whole test suite once more with the heaps' folios larger than their
# pages: shmem_enabled=within_size, the system setting that gives memfds
# (the heaps) huge folios. sparsebuf never changes it; a system may have
# it, and then a pool page is part of a folio, whose release (a hole
# punch) the kernel may not split, leaving the range zeroed in place
# (docs/design.md, "Heap folios"). This run sets it, for the suite alone,
# and puts it back, also on Ctrl-C; skipped, saying so, where it cannot.
#   scripts/test-folios.sh BUILD
set -u
build=${1:-build}
. "$(dirname "$0")/knob.sh"
knob_shmem_ready "the suite with huge heap folios" || exit 0
knob=$knob_shmem
knob_stale
was=$(knob_value "$knob")
# A kill -9 cannot be trapped: say how to put it back first (the next
# bench or test script that changes a setting does it too).
echo "(shmem_enabled is within_size for this run; if it is killed," \
	"restore it: echo $was > $knob)"
trap knob_restore EXIT
trap 'exit 130' INT TERM
trap 'exit 129' HUP
trap 'exit 141' PIPE
knob_set "$knob" within_size || exit 1
tests/run.sh "$build/tests"
