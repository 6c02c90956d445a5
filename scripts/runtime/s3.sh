#!/usr/bin/env bash
# s3.sh — a real S3-compatible server for the tests of corral's S3 blob store.
#
#   scripts/runtime/s3.sh            # idempotent; a second run only checks
#
# Builds SeaweedFS's `weed` (its S3 gateway, run as `weed mini` by test/s3test) from the Go module
# proxy into $CORRAL_CACHE/seaweedfs/<version>/ and links $CORRAL_BIN/weed at it. Only the tests
# use it: `corral dev` keeps its blobs in a local directory.
#
# Why SeaweedFS: it is an S3 server written in Go whose module the proxy serves, so it builds here
# like runsc and containerd; MinIO's server is not served (only its client, which corral uses) and
# the other Go S3 servers served are in-process fakes. Its go.mod has a replace directive, which
# `go install pkg@version` refuses, so it is built inside a copy of the module as the main module.
# The build takes minutes (some 300 modules); it is cached like the runtime's.
set -Eeuo pipefail

# ---- pin (change it to rebuild) ----------------------------------------------------------------
SEAWEEDFS_MODULE=github.com/seaweedfs/seaweedfs
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
# ------------------------------------------------------------------------------------------------

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"

lock s3

main() {
	need_cmd go
	local dest="$CORRAL_CACHE/seaweedfs/$SEAWEEDFS_VERSION"
	local bin="$dest/weed" stamp="$dest/weed.module"
	if [[ -x $bin && -f $stamp && $(<"$stamp") == "$SEAWEEDFS_MODULE@$SEAWEEDFS_VERSION" ]]; then
		log "seaweedfs $SEAWEEDFS_VERSION present: $bin"
	else
		mkdir -p "$CORRAL_CACHE/seaweedfs" "$CORRAL_LOGS"
		local tmp work src logf="$CORRAL_LOGS/seaweedfs.log" start
		tmp="$(mktemp -d "$CORRAL_CACHE/seaweedfs/.build-XXXXXX")"
		work="$(mktemp -d)"
		log "building seaweedfs ($SEAWEEDFS_MODULE@$SEAWEEDFS_VERSION) — this takes minutes on 2 cores; log: $logf"
		start="$(date +%s.%N)"
		if ! src="$(cd "$work" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "$SEAWEEDFS_MODULE@$SEAWEEDFS_VERSION" 2>>"$logf" |
			sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')" || [[ -z $src ]]; then
			rm -rf "$tmp" "$work"
			tail -n 20 "$logf" >&2 || true
			die "downloading $SEAWEEDFS_MODULE@$SEAWEEDFS_VERSION failed (log: $logf)"
		fi
		cp -r "$src/." "$work/" && chmod -R u+w "$work"
		if ! (cd "$work" && env CGO_ENABLED=0 GOWORK=off GOFLAGS=-buildvcs=false \
			go build -trimpath -ldflags "-s -w" -o "$tmp/weed" ./weed) >>"$logf" 2>&1; then
			rm -rf "$tmp" "$work"
			tail -n 20 "$logf" >&2 || true
			die "building seaweedfs failed (full log: $logf)"
		fi
		rm -rf "$work" "$dest"
		printf '%s\n' "$SEAWEEDFS_MODULE@$SEAWEEDFS_VERSION" >"$tmp/weed.module"
		chmod 0755 "$tmp"
		mv "$tmp" "$dest"
		log "built seaweedfs in $(elapsed "$start") s"
	fi
	mkdir -p "$CORRAL_BIN"
	if [[ $(readlink "$CORRAL_BIN/weed" 2>/dev/null || true) != "$bin" ]]; then
		ln -sfn "$bin" "$CORRAL_BIN/.weed.new"
		mv -Tf "$CORRAL_BIN/.weed.new" "$CORRAL_BIN/weed"
		log "linked $CORRAL_BIN/weed -> $bin"
	fi
}

# One line, so a run never reads past it even if this file is edited meanwhile.
main "$@"; exit
