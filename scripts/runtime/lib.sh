# shellcheck shell=bash disable=SC2034 # its variables are used by the scripts that source it
# Shared helpers for scripts/runtime/*.sh. Source it; do not run it.
#
# Every script logs progress to stderr as "corral-runtime[<script>]: ..." and, on failure, ends
# with exactly one line starting "corral-runtime[<script>]: error:".

CORRAL_CACHE="${CORRAL_CACHE:-/var/cache/corral}"
CORRAL_BIN="$CORRAL_CACHE/bin"
CORRAL_IMAGES="$CORRAL_CACHE/images"
CORRAL_LOGS="$CORRAL_CACHE/build-logs"

_corral_script="${0##*/}"

log() { printf 'corral-runtime[%s]: %s\n' "$_corral_script" "$*" >&2; }
warn() { printf 'corral-runtime[%s]: warning: %s\n' "$_corral_script" "$*" >&2; }
die() {
	printf 'corral-runtime[%s]: error: %s\n' "$_corral_script" "$*" >&2
	exit 1
}

# An unexpected failing command (set -e) still ends with one clear error line. Scripts use
# `set -Eeuo pipefail` so the trap also fires inside functions; it reports only in the script's
# own shell, not in each command substitution on the way out.
_corral_on_err() {
	local rc=$1 line=$2 cmd=$3
	[[ $BASH_SUBSHELL -eq 0 ]] || return 0
	# shellcheck disable=SC2016 # the backquotes are literal
	printf 'corral-runtime[%s]: error: line %s: `%s` exited with status %s\n' \
		"$_corral_script" "$line" "$cmd" "$rc" >&2
}
trap '_corral_on_err $? $LINENO "$BASH_COMMAND"' ERR

need_root() {
	[[ $(id -u) -eq 0 ]] || die "$1 needs root (run it as root or with sudo)"
}

need_cmd() {
	local c
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 || die "required command '$c' not found in PATH"
	done
}

# lock NAME: hold an exclusive lock on $CORRAL_CACHE/.NAME.lock for the rest of the script, so two
# runs at once (two CI jobs, a developer and a test) do not build into the same directory.
lock() {
	mkdir -p "$CORRAL_CACHE"
	exec 9>"$CORRAL_CACHE/.$1.lock"
	if ! flock -n 9; then
		log "waiting for another run holding $CORRAL_CACHE/.$1.lock"
		flock 9
	fi
}

# elapsed START: seconds since START (from `date +%s.%N`) with one decimal.
elapsed() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }
