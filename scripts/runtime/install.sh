#!/usr/bin/env bash
# install.sh — make this host able to run gVisor sandboxes through a private containerd.
#
#   scripts/runtime/install.sh            # idempotent; a second run only checks
#
# Installs the Debian packages it needs, builds static runsc and containerd v2 (daemon, ctr and the
# runc shim) from the Go module proxy into version-named directories under $CORRAL_CACHE, and
# points the stable symlinks in $CORRAL_CACHE/bin at them. A build is redone only when its pin
# below changes (or its output is missing). Needs root and Go.
set -Eeuo pipefail

# ---- pins (change a pin to rebuild) -----------------------------------------------------------
# gVisor publishes no module tags: this is a pseudo-version of its `go` branch, tested on
# Debian 12 / kernel 6.18 with platform systrap.
RUNSC_MODULE=gvisor.dev/gvisor
RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
CONTAINERD_MODULE=github.com/containerd/containerd/v2
CONTAINERD_VERSION=v2.2.9
CONTAINERD_TAGS="no_btrfs no_devmapper no_zfs"
# docker-registry is for the driver's registry-pull test only (a registry on loopback); its
# service, where the package starts one, is stopped right after install.
APT_PACKAGES=(runc containerd busybox-static debootstrap iproute2 docker-registry)
# Opt-in: gVisor's own containerd shim (runtime type io.containerd.runsc.v1), same gVisor pin. Only
# useful on hosts with CAP_SYS_RESOURCE; corral's default runs runsc under the runc shim instead.
WITH_RUNSC_SHIM="${CORRAL_WITH_RUNSC_SHIM:-0}"
# ------------------------------------------------------------------------------------------------

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"

need_root "install.sh"
lock install

# ---- Debian packages -----------------------------------------------------------------------------
install_apt_packages() {
	local missing=() p
	for p in "${APT_PACKAGES[@]}"; do
		dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
	done
	if ((${#missing[@]} == 0)); then
		log "apt packages present: ${APT_PACKAGES[*]}"
		return
	fi
	log "installing apt packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2 || die "apt-get update failed"
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
		die "apt-get install ${missing[*]} failed"
	if command -v systemctl >/dev/null 2>&1; then
		systemctl disable --now docker-registry >/dev/null 2>&1 || true
	fi
	# Debian's containerd package starts the system containerd; corral never uses it (it runs its
	# own with scripts/runtime/containerd.sh), and only its files matter here. Leave it as it is.
}

# ---- Go builds -------------------------------------------------------------------------------------
# is_static_build BIN MODULE VERSION: BIN exists, was built from MODULE@VERSION, without cgo.
# (A cgo-linked runsc fails at sandbox boot: its chroot has no dynamic loader.)
is_static_build() {
	local bin=$1 module=$2 version=$3 info
	[[ -x $bin ]] || return 1
	info="$(go version -m "$bin" 2>/dev/null)" || return 1
	awk -v m="$module" -v v="$version" '
		$1 == "mod" && $2 == m && $3 == v { mod = 1 }
		$1 == "build" && $2 == "CGO_ENABLED=0" { static = 1 }
		END { exit !(mod && static) }' <<<"$info"
}

# go_build NAME DEST_DIR TAGS PKG@VERSION...: go install the packages into a temporary GOBIN next
# to DEST_DIR, then move the directory into place, so DEST_DIR only ever holds a complete build.
# Runs from an empty temporary directory so no go.mod (the repo's) is involved.
go_build() {
	local name=$1 dest=$2 tags=$3
	shift 3
	local tmp work logf start flags=()
	[[ -z $tags ]] || flags=(-tags "$tags")
	tmp="$(mktemp -d "$(dirname "$dest")/.build-XXXXXX")"
	work="$(mktemp -d)"
	logf="$CORRAL_LOGS/$name.log"
	mkdir -p "$CORRAL_LOGS"
	log "building $name ($*) — this takes minutes on 2 cores; log: $logf"
	start="$(date +%s.%N)"
	if ! (cd "$work" && env CGO_ENABLED=0 GOBIN="$tmp" GOWORK=off GOFLAGS=-buildvcs=false \
		go install "${flags[@]}" "$@") >"$logf" 2>&1; then
		rm -rf "$tmp" "$work"
		tail -n 20 "$logf" >&2 || true
		die "building $name failed (full log: $logf)"
	fi
	rm -rf "$work" "$dest"
	chmod 0755 "$tmp"
	mv "$tmp" "$dest"
	log "built $name in $(elapsed "$start") s"
}

build_runsc() {
	local dest="$CORRAL_CACHE/runsc/$RUNSC_VERSION"
	RUNSC_BIN="$dest/runsc"
	if is_static_build "$RUNSC_BIN" "$RUNSC_MODULE" "$RUNSC_VERSION"; then
		log "runsc $RUNSC_VERSION present: $RUNSC_BIN"
		return
	fi
	mkdir -p "$(dirname "$dest")"
	go_build runsc "$dest" "" "$RUNSC_MODULE/runsc@$RUNSC_VERSION"
	is_static_build "$RUNSC_BIN" "$RUNSC_MODULE" "$RUNSC_VERSION" ||
		die "$RUNSC_BIN is not a static build of $RUNSC_MODULE@$RUNSC_VERSION"
}

# gVisor's shim package is gvisor.dev/gvisor/shim (binary "shim"); containerd looks for
# containerd-shim-runsc-v1, so it is renamed after the build.
build_runsc_shim() {
	local dest="$CORRAL_CACHE/runsc-shim/$RUNSC_VERSION"
	RUNSC_SHIM_BIN="$dest/containerd-shim-runsc-v1"
	if is_static_build "$RUNSC_SHIM_BIN" "$RUNSC_MODULE" "$RUNSC_VERSION"; then
		log "containerd-shim-runsc-v1 $RUNSC_VERSION present: $RUNSC_SHIM_BIN"
		return
	fi
	mkdir -p "$(dirname "$dest")"
	go_build runsc-shim "$dest" "" "$RUNSC_MODULE/shim@$RUNSC_VERSION"
	mv "$dest/shim" "$RUNSC_SHIM_BIN"
	is_static_build "$RUNSC_SHIM_BIN" "$RUNSC_MODULE" "$RUNSC_VERSION" ||
		die "$RUNSC_SHIM_BIN is not a static build of $RUNSC_MODULE@$RUNSC_VERSION"
}

build_containerd() {
	local dest="$CORRAL_CACHE/containerd/$CONTAINERD_VERSION" b ok=1
	CONTAINERD_DIR="$dest"
	for b in containerd ctr containerd-shim-runc-v2; do
		is_static_build "$dest/$b" "$CONTAINERD_MODULE" "$CONTAINERD_VERSION" || ok=0
	done
	if ((ok)); then
		log "containerd $CONTAINERD_VERSION present: $dest"
		return
	fi
	mkdir -p "$(dirname "$dest")"
	# One go install for all three: the shim then matches the daemon exactly (same module version,
	# same dependency versions), instead of Debian's 1.6 shim.
	go_build containerd "$dest" "$CONTAINERD_TAGS" \
		"$CONTAINERD_MODULE/cmd/containerd@$CONTAINERD_VERSION" \
		"$CONTAINERD_MODULE/cmd/ctr@$CONTAINERD_VERSION" \
		"$CONTAINERD_MODULE/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
	for b in containerd ctr containerd-shim-runc-v2; do
		is_static_build "$dest/$b" "$CONTAINERD_MODULE" "$CONTAINERD_VERSION" ||
			die "$dest/$b is not a static build of $CONTAINERD_MODULE@$CONTAINERD_VERSION"
	done
}

# ---- stable symlinks ---------------------------------------------------------------------------------
# link NAME TARGET: $CORRAL_BIN/NAME -> TARGET, replaced atomically (never a moment without it).
link() {
	local name=$1 target=$2 cur
	cur="$(readlink "$CORRAL_BIN/$name" 2>/dev/null || true)"
	[[ $cur == "$target" ]] && return
	ln -sfn "$target" "$CORRAL_BIN/.$name.new"
	mv -Tf "$CORRAL_BIN/.$name.new" "$CORRAL_BIN/$name"
	log "linked $CORRAL_BIN/$name -> $target"
}

main() {
	need_cmd dpkg apt-get flock
	install_apt_packages
	need_cmd go runc
	log "cache: $CORRAL_CACHE ($(go version))"
	build_runsc
	build_containerd
	mkdir -p "$CORRAL_BIN"
	link runsc "$RUNSC_BIN"
	link containerd "$CONTAINERD_DIR/containerd"
	link ctr "$CONTAINERD_DIR/ctr"
	link containerd-shim-runc-v2 "$CONTAINERD_DIR/containerd-shim-runc-v2"
	local names=(runsc containerd ctr containerd-shim-runc-v2)
	if [[ $WITH_RUNSC_SHIM == 1 ]]; then
		build_runsc_shim
		link containerd-shim-runsc-v1 "$RUNSC_SHIM_BIN"
		names+=(containerd-shim-runsc-v1)
	fi

	log "installed:"
	local b
	for b in "${names[@]}"; do
		printf '  %s -> %s\n' "$CORRAL_BIN/$b" "$(readlink "$CORRAL_BIN/$b")"
	done
	printf '  %-20s %s\n' "runc (Debian)" "$(command -v runc)"
	printf '  %-20s %s\n' "busybox (Debian)" "$(command -v busybox || echo /bin/busybox)"
	printf '  %-20s %s\n' "debootstrap (Debian)" "$(command -v debootstrap)"
}

# One line, so a run never reads past it even if this file is edited meanwhile.
main "$@"; exit
