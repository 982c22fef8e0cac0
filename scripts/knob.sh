# System settings a script changes for its run, and puts back. Sourced by
# the bench and test scripts that change one (vm.max_map_count,
# shmem_enabled); sparsebuf itself never changes them.
#
#   knob_stale               put back what a killed run left changed
#   knob_set FILE VALUE      write VALUE to FILE, noting its value first
#   knob_restore             put back every FILE this run changed
#   knob_value FILE          the value now (the [chosen] word of a sysfs
#                            choice list such as shmem_enabled)
#
# The exit trap puts a setting back, but no trap sees a kill -9. So before
# the first change of a FILE, a note "PID START FILE VALUE" goes into
# /run/sparsebuf-knobs (a tmpfs: gone at a reboot, as the changes are;
# SPARSEBUF_KNOB_DIR elsewhere, as test_cli does), and the next
# script that calls knob_stale puts back the value of any note whose
# process is gone (PID, and START, its start time, against a reused PID).
# A note whose process lives is another run's: that run puts it back, and
# this one changes FILE without a note of its own.
# (Its functions set only variables named knob_*: a sourced file's
# variables are the script's.)
knob_dir=${SPARSEBUF_KNOB_DIR:-/run/sparsebuf-knobs}
knob_owned=""

knob_value() {
	sed 's/.*\[\(.*\)\].*/\1/' "$1"
}

# The start time of process $1 (field 22 of /proc/PID/stat, after the
# command's closing parenthesis), empty when it is gone.
knob_start() {
	sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20
}

knob_note() {
	echo "$knob_dir/$(echo "$1" | tr / :)"
}

# knob_alive NOTE: whether the run that wrote NOTE still runs.
knob_alive() {
	set -- $(cat "$1" 2>/dev/null)
	[ $# -ge 4 ] && [ -n "$(knob_start "$1")" ] &&
		[ "$(knob_start "$1")" = "$2" ]
}

knob_stale() {
	[ -d "$knob_dir" ] || return 0
	for knob_n in "$knob_dir"/*; do
		[ -f "$knob_n" ] || continue
		knob_alive "$knob_n" && continue
		knob_f=$(cut -d' ' -f3 "$knob_n")
		knob_v=$(cut -d' ' -f4- "$knob_n")
		if [ -w "$knob_f" ] && echo "$knob_v" >"$knob_f"; then
			echo "($knob_f put back to $knob_v: a run killed before" \
				"it could (pid $(cut -d' ' -f1 "$knob_n")) had" \
				"changed it)" >&2
		fi
		rm -f "$knob_n"
	done
}

knob_set() {
	case " $knob_owned " in
	*" $1 "*) ;;
	*)
		knob_stale
		knob_sn=$(knob_note "$1")
		if ! knob_alive "$knob_sn"; then
			mkdir -p "$knob_dir" &&
				echo "$$ $(knob_start $$) $1 $(knob_value "$1")" \
					>"$knob_sn.$$" &&
				mv "$knob_sn.$$" "$knob_sn" || return 1
			knob_owned="$knob_owned $1"
		fi ;;
	esac
	echo "$2" >"$1"
}

knob_restore() {
	for knob_rf in $knob_owned; do
		knob_rn=$(knob_note "$knob_rf")
		[ -f "$knob_rn" ] && cut -d' ' -f4- "$knob_rn" >"$knob_rf" &&
			rm -f "$knob_rn"
	done
	knob_owned=""
}
