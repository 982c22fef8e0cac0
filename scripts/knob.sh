# System settings a script changes for its run, and puts back. Sourced by
# the bench and test scripts that change one (vm.max_map_count,
# shmem_enabled) and by tests/run.sh; sparsebuf itself never changes them.
#
#   knob_set FILE VALUE [raise]   hold FILE at VALUE for this run (raise:
#                                 at least VALUE; a larger value stays).
#                                 Returns 1 when the note cannot be kept
#                                 (nothing changed), 2 when another live
#                                 run holds FILE at another value (said)
#   knob_restore                  this run lets go of what it holds
#   knob_stale                    let go for runs that are gone
#   knob_value FILE               the value now (the [chosen] word of a
#                                 sysfs choice list such as shmem_enabled)
#   knob_changed                  1 when the last knob_set wrote FILE
#   knob_shmem_ready WHAT         0 when shmem_enabled can be set to
#                                 within_size here (knob_shmem: its path);
#                                 else 1, having printed a test runner's
#                                 SKIP of WHAT and its summary line
#   knob_hugepages NEED           at least NEED 2 MiB huge pages free and
#                                 not reserved by a mapping, raising
#                                 vm.nr_hugepages for this run when fewer
#                                 are (a knob_set ... raise). 0 when they
#                                 are (knob_hp_free: how many), else 1
#                                 with the reason in knob_why. The caller
#                                 sets its exit trap (knob_restore) first
#   knob_quiet MAX                wait (up to MAX seconds) until the
#                                 kernel's compaction and collapse threads
#                                 (kcompactd*, khugepaged) took no CPU
#                                 for a whole second: 0 then, 1 if they
#                                 never did; knob_quiet_s: seconds waited
#
# The exit trap lets go, but no trap sees a kill -9. So each FILE held has
# a directory of notes in /run/sparsebuf-knobs (SPARSEBUF_KNOB_DIR
# elsewhere, as test_cli does): `orig`, the value before the first holder
# changed it, with the boot it was read in; `set`, the last value a holder
# wrote; a file for each holder, named PID.START (START, the process's
# start time, tells a reused PID apart). The value goes back when the
# last live holder lets go, or, after a kill -9, when the next script
# calls knob_stale: only if FILE still holds what the holders set (someone
# may have set it since), and never from a note of an earlier boot (/run
# may not be a tmpfs). Every change of the notes is made under flock(1)
# on $knob_dir/.lock (file descriptor 9), so that two runs starting or
# ending together cannot undo each other.
# (Its functions set only variables named knob_*: a sourced file's
# variables are the script's.)
knob_dir=${SPARSEBUF_KNOB_DIR:-/run/sparsebuf-knobs}
knob_owned=""
knob_changed=0

knob_value() {
	sed 's/.*\[\(.*\)\].*/\1/' "$1"
}

# The start time of process $1 (field 22 of /proc/PID/stat, after the
# command's closing parenthesis), empty when it is gone, or dead and not
# yet reaped (a zombie: a killed script whose parent went first waits
# for an init that may never reap it).
knob_start() {
	sed 's/.*) //' "/proc/$1/stat" 2>/dev/null |
		awk '$1 != "Z" && $1 != "X" { print $20 }'
}

knob_boot() {
	cat /proc/sys/kernel/random/boot_id 2>/dev/null
}

knob_key() {
	echo "$knob_dir/$(echo "$1" | tr / :)"
}

knob_lock() {
	mkdir -p "$knob_dir" 2>/dev/null && exec 9>>"$knob_dir/.lock" &&
		flock 9
}

knob_unlock() {
	flock -u 9
	exec 9>&-
}

# knob_put FILE VALUE: write it into a note atomically.
knob_put() {
	echo "$2" >"$1.$$" && mv "$1.$$" "$1"
}

# knob_sweep KEYDIR: drop the holders that are gone; with none left, put
# the value back and drop the notes. Under the lock.
knob_sweep() {
	knob_live=0
	for knob_h in "$1"/[0-9]*; do
		[ -f "$knob_h" ] || continue
		knob_p=${knob_h##*/}
		# (A start recorded, and the same process's now: alive.)
		if [ -n "${knob_p#*.}" ] &&
			[ "$(knob_start "${knob_p%%.*}")" = "${knob_p#*.}" ]; then
			knob_live=$((knob_live + 1))
		else
			rm -f "$knob_h"
		fi
	done
	[ $knob_live = 0 ] || return 0
	[ -f "$1/orig" ] || { rm -rf "$1"; return 0; }
	set -- "$1" $(cat "$1/orig")	# KEYDIR BOOT FILE VALUE...
	knob_k=$1 knob_b=$2 knob_f=$3
	shift 3
	if [ "$knob_b" != "$(knob_boot)" ] || [ ! -f "$knob_k/set" ]; then
		rm -rf "$knob_k"	# another boot's, or never changed
	elif [ "$(knob_value "$knob_f")" != "$(cat "$knob_k/set")" ]; then
		echo "($knob_f left at $(knob_value "$knob_f"): set since a" \
			"run that held it at $(cat "$knob_k/set") ended)" >&2
		rm -rf "$knob_k"
	elif echo "$*" >"$knob_f"; then
		rm -rf "$knob_k"
	else
		echo "(cannot put $knob_f back to $*: notes kept in $knob_k)" >&2
	fi
}

knob_stale() {
	[ -d "$knob_dir" ] && [ -w "$knob_dir" ] || return 0
	knob_lock || return 0
	for knob_d in "$knob_dir"/:*; do
		[ -d "$knob_d" ] || continue
		knob_w=$(cut -d' ' -f2 "$knob_d/orig" 2>/dev/null)
		knob_was=$(knob_value "$knob_w" 2>/dev/null)
		knob_sweep "$knob_d"
		[ -d "$knob_d" ] || [ -z "$knob_w" ] ||
			[ "$(knob_value "$knob_w")" = "$knob_was" ] ||
			echo "($knob_w put back to $(knob_value "$knob_w"):" \
				"a run killed before it could had changed it)" >&2
	done
	knob_unlock
}

knob_set() {
	knob_changed=0
	knob_lock || return 1
	knob_d=$(knob_key "$1")
	knob_me="$$.$(knob_start $$)"
	[ -d "$knob_d" ] && knob_sweep "$knob_d"
	mkdir -p "$knob_d" || { knob_unlock; return 1; }
	[ -f "$knob_d/orig" ] ||
		knob_put "$knob_d/orig" "$(knob_boot) $1 $(knob_value "$1")" ||
		{ knob_unlock; return 1; }
	knob_cur=$(knob_value "$1")
	if [ "${3:-}" = raise ]; then
		[ "$knob_cur" -lt "$2" ] 2>/dev/null && knob_changed=1
	elif [ "$knob_cur" != "$2" ]; then
		for knob_h in "$knob_d"/[0-9]*; do
			[ -f "$knob_h" ] && [ "${knob_h##*/}" != "$knob_me" ] || continue
			echo "$1 is held at $knob_cur by another run" \
				"(pid ${knob_h##*/}): not changed" >&2
			knob_unlock
			return 2
		done
		knob_changed=1
	fi
	knob_put "$knob_d/$knob_me" "$2" || { knob_unlock; return 1; }
	case " $knob_owned " in *" $1 "*) ;; *) knob_owned="$knob_owned $1" ;; esac
	if [ $knob_changed = 1 ]; then
		if ! knob_put "$knob_d/set" "$2" || ! echo "$2" >"$1"; then
			knob_changed=0
			knob_unlock
			return 1
		fi
		# What the kernel took, which may be less than asked
		# (vm.nr_hugepages reserves what free memory allows): the
		# value that is put back only if nobody changed it since.
		knob_put "$knob_d/set" "$(knob_value "$1")"
	fi
	knob_unlock
}

knob_restore() {
	[ -n "$knob_owned" ] || return 0
	knob_lock || return 0
	for knob_rf in $knob_owned; do
		knob_d=$(knob_key "$knob_rf")
		rm -f "$knob_d/$$.$(knob_start $$)"
		[ -d "$knob_d" ] && knob_sweep "$knob_d"
	done
	knob_owned=""
	knob_unlock
}

knob_hp_meminfo() {
	awk -v k="$1:" '$1 == k { print $2 }' /proc/meminfo
}

knob_hugepages() {
	knob_hp=/proc/sys/vm/nr_hugepages
	knob_why=""
	if [ "$(knob_hp_meminfo Hugepagesize)" != 2048 ]; then
		knob_why="no 2 MiB huge pages (Hugepagesize in /proc/meminfo)"
		return 1
	fi
	knob_hp_free=$(($(knob_hp_meminfo HugePages_Free) - $(knob_hp_meminfo HugePages_Rsvd)))
	[ "$knob_hp_free" -ge "$1" ] && return 0
	if [ ! -w "$knob_hp" ]; then
		knob_why="$knob_hp_free huge pages free, $1 needed, and $knob_hp is not writable here (root)"
		return 1
	fi
	# Never more than free memory can give with 1 GiB left over: the
	# kernel would take what it can, and the machine has no swap.
	if [ $((($1 - knob_hp_free) * 2048 + 1048576)) -gt "$(knob_hp_meminfo MemAvailable)" ]; then
		knob_why="$knob_hp_free huge pages free, $1 needed, and $(($(knob_hp_meminfo MemAvailable) >> 10)) MiB of memory available"
		return 1
	fi
	echo "(vm.nr_hugepages is raised for this run; if this is killed," \
		"restore it: echo $(cat "$knob_hp") > $knob_hp)"
	knob_set "$knob_hp" $(($(cat "$knob_hp") + $1 - knob_hp_free)) raise
	knob_hp_free=$(($(knob_hp_meminfo HugePages_Free) - $(knob_hp_meminfo HugePages_Rsvd)))
	[ "$knob_hp_free" -ge "$1" ] && return 0
	knob_why="only $knob_hp_free huge pages could be reserved, $1 needed: not enough free memory"
	return 1
}

knob_shmem=/sys/kernel/mm/transparent_hugepage/shmem_enabled
knob_shmem_ready() {
	[ -w "$knob_shmem" ] && grep -q within_size "$knob_shmem" && return 0
	echo "SKIP  $1: $knob_shmem is not writable here or has no" \
		"within_size (root and transparent huge pages needed)"
	echo "0 passed, 0 failed, 1 skipped"
	return 1
}

# The CPU time, in ticks, of the kernel threads that compact memory and
# collapse huge pages. Reserving huge pages sets them going, and on a
# 2-CPU machine they take the CPU from whatever is measured next: a
# benchmark run on huge pages just reserved timed their work as its
# stalls (docs/PERFORMANCE.md, "make demo on the Intel KVM host").
# (Kernel threads are children of kthreadd, PID 2: only those are read,
# with the shell's own read, not a process per look.)
knob_kthread_ticks() {
	knob_t=0
	for knob_c in /proc/[0-9]*/stat; do
		# (2> first: a process gone meanwhile says nothing)
		read -r knob_l 2>/dev/null <"$knob_c" || continue
		case $knob_l in
		*"(kcompactd"*") "* | *"(khugepaged) "*) ;;
		*) continue ;;
		esac
		# shellcheck disable=SC2086 # split into fields on purpose
		set -- ${knob_l##*) }
		[ "$2" = 2 ] && knob_t=$((knob_t + ${12} + ${13}))
	done
	echo "$knob_t"
}

knob_quiet() {
	knob_quiet_s=0
	knob_q_was=$(knob_kthread_ticks)
	while [ "$knob_quiet_s" -lt "$1" ]; do
		sleep 1
		knob_q_now=$(knob_kthread_ticks)
		[ "$knob_q_now" = "$knob_q_was" ] && return 0
		knob_q_was=$knob_q_now
		knob_quiet_s=$((knob_quiet_s + 1))
	done
	return 1
}
