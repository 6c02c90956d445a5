#!/usr/bin/env bash
# images.sh — build corral's base images without a registry, as OCI image tarballs.
#
#   scripts/runtime/images.sh [busybox|debian|node]...   # default: all three; idempotent
#
# Output, under $CORRAL_CACHE/images/:
#   busybox.oci.tar  localhost/corral/busybox:<BUSYBOX_RECIPE>        (from Debian's busybox-static)
#   debian.oci.tar   localhost/corral/debian:bookworm-<DEBIAN_RECIPE>  (debootstrap minbase)
#   node.oci.tar     localhost/corral/debian-node:bookworm-<NODE_RECIPE>  (the same, with nodejs and npm:
#                    the image of the tests' npm package builds)
# Each tarball is an OCI image layout (oci-layout, index.json, blobs/sha256/...) with one
# uncompressed layer, written here with tar and sha256sum. Next to each is NAME.oci.tar.key; an
# image is rebuilt only when its key (recipe version, and for busybox the package version) changes.
# Import one with:  ctr -n corral images import --all-platforms $CORRAL_CACHE/images/busybox.oci.tar
# (scripts/runtime/containerd.sh start does that). Needs root (chroot, chown, debootstrap).
set -Eeuo pipefail

# ---- recipes (bump a recipe version whenever its build below changes) -------------------------
BUSYBOX_RECIPE=1
BUSYBOX_REF="localhost/corral/busybox:$BUSYBOX_RECIPE"
DEBIAN_SUITE=bookworm
DEBIAN_RECIPE=2
DEBIAN_REF="localhost/corral/debian:$DEBIAN_SUITE-$DEBIAN_RECIPE"
DEBIAN_INCLUDE=bash,coreutils,findutils,grep,python3,python3-pip,git,ca-certificates
NODE_RECIPE=1
NODE_REF="localhost/corral/debian-node:$DEBIAN_SUITE-$NODE_RECIPE"
# npm's hundreds of dependencies are more than debootstrap's --include orders right: they are
# installed with apt-get in the finished root instead.
NODE_PACKAGES="nodejs npm"
# Image config shared by both: the only Env is PATH; processes run as sandbox (1000:1000).
IMAGE_PATH_ENV="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_UID=1000
SANDBOX_GID=1000
# ------------------------------------------------------------------------------------------------

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"

need_root "images.sh"
need_cmd tar sha256sum stat dpkg dpkg-query
lock images
mkdir -p "$CORRAL_IMAGES"

# oci_arch: this host's architecture in OCI terms.
oci_arch() {
	case "$(dpkg --print-architecture)" in
	amd64) echo amd64 ;;
	arm64) echo arm64 ;;
	*) die "unsupported architecture $(dpkg --print-architecture) (images.sh knows amd64 and arm64)" ;;
	esac
}

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

# put_blob DIR FILE: move FILE into DIR/blobs/sha256/<digest>; prints the digest (hex).
put_blob() {
	local dir=$1 file=$2 d
	d="$(sha256_of "$file")"
	mv "$file" "$dir/blobs/sha256/$d"
	echo "$d"
}

# write_oci_tar ROOTFS REF OUT CMD [TAR_ARGS...]: package ROOTFS as a one-layer OCI image named REF
# into the tarball OUT (replaced atomically). TAR_ARGS are extra GNU tar options for the layer.
write_oci_tar() {
	local rootfs=$1 ref=$2 out=$3 cmd=$4
	shift 4
	local arch layout tag layer_d layer_n config_d config_n manifest_d manifest_n
	arch="$(oci_arch)"
	tag="${ref##*:}"
	layout="$(mktemp -d "$CORRAL_IMAGES/.layout-XXXXXX")"
	WORKDIRS+=("$layout")
	mkdir -p "$layout/blobs/sha256"

	log "packing layer of $ref"
	# Layer: the whole root filesystem, numeric owners kept, entries sorted so the digest depends
	# only on the content.
	tar --create --file "$layout/layer.tar" --directory "$rootfs" \
		--sort=name --numeric-owner --format=posix \
		--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime "$@" .
	layer_n="$(size_of "$layout/layer.tar")"
	layer_d="$(put_blob "$layout" "$layout/layer.tar")"

	# Image config. An uncompressed layer's digest is also its diff_id.
	cat >"$layout/config.json" <<-EOF
		{"architecture":"$arch","os":"linux","config":{"User":"$SANDBOX_UID:$SANDBOX_GID","Env":["$IMAGE_PATH_ENV"],"Cmd":["$cmd"],"WorkingDir":"/workspace"},"rootfs":{"type":"layers","diff_ids":["sha256:$layer_d"]},"history":[{"created_by":"corral scripts/runtime/images.sh: $ref"}]}
	EOF
	config_n="$(size_of "$layout/config.json")"
	config_d="$(put_blob "$layout" "$layout/config.json")"

	cat >"$layout/manifest.json" <<-EOF
		{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$config_d","size":$config_n},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:$layer_d","size":$layer_n}]}
	EOF
	manifest_n="$(size_of "$layout/manifest.json")"
	manifest_d="$(put_blob "$layout" "$layout/manifest.json")"

	# index.json: containerd names the image from io.containerd.image.name; the OCI ref.name
	# annotation carries the tag, as `docker save` writes it.
	cat >"$layout/index.json" <<-EOF
		{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$manifest_d","size":$manifest_n,"platform":{"architecture":"$arch","os":"linux"},"annotations":{"io.containerd.image.name":"$ref","org.opencontainers.image.ref.name":"$tag"}}]}
	EOF
	echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"

	tar --create --file "$layout/image.tar" --directory "$layout" \
		--sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
		oci-layout index.json blobs
	mv -f "$layout/image.tar" "$out"
	rm -rf "$layout"
	log "wrote $out ($ref, manifest sha256:$manifest_d, $((layer_n / 1024 / 1024)) MiB layer)"
}

# up_to_date NAME KEY: the tarball and its key file exist and the key matches.
up_to_date() {
	local name=$1 key=$2
	[[ -s $CORRAL_IMAGES/$name.oci.tar && -f $CORRAL_IMAGES/$name.oci.tar.key ]] &&
		[[ "$(cat "$CORRAL_IMAGES/$name.oci.tar.key")" == "$key" ]]
}

# new_workdir NAME: a fresh scratch directory for building image NAME (removed on exit).
WORKDIRS=()
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	local d
	for d in "${WORKDIRS[@]}"; do
		[[ -n $d && -d $d ]] && rm -rf --one-file-system "$d"
	done
	return 0
}
trap cleanup EXIT

# ---- busybox ---------------------------------------------------------------------------------------
build_busybox() {
	need_cmd busybox
	local bb key work r start
	bb="$(command -v busybox)"
	key="recipe=$BUSYBOX_RECIPE ref=$BUSYBOX_REF busybox-static=$(dpkg-query -W -f '${Version}' busybox-static)"
	if up_to_date busybox "$key"; then
		log "busybox image up to date: $CORRAL_IMAGES/busybox.oci.tar ($BUSYBOX_REF)"
		return
	fi
	start="$(date +%s.%N)"
	log "building busybox image $BUSYBOX_REF"
	work="$(mktemp -d "$CORRAL_IMAGES/.busybox-XXXXXX")"
	WORKDIRS+=("$work")
	r="$work/rootfs"
	mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,root,home/sandbox,workspace,tmp,proc,sys,dev,var/tmp}
	install -m 0755 "$bb" "$r/bin/busybox"
	# The same as `busybox --install -s` run inside the rootfs (absolute symlinks to /bin/busybox at
	# each applet's standard path), without needing a chroot with /proc mounted.
	local applet
	while read -r applet; do
		[[ -e $r/$applet || -L $r/$applet ]] || ln -s /bin/busybox "$r/$applet"
	done < <("$r/bin/busybox" --list-full)
	[[ -L $r/bin/sh && -L $r/usr/bin/id && -L $r/bin/sleep ]] || die "busybox --list-full gave no sh/id/sleep"

	cat >"$r/etc/passwd" <<-EOF
		root:x:0:0:root:/root:/bin/sh
		sandbox:x:$SANDBOX_UID:$SANDBOX_GID:sandbox:/home/sandbox:/bin/sh
		nobody:x:65534:65534:nobody:/nonexistent:/bin/false
	EOF
	cat >"$r/etc/group" <<-EOF
		root:x:0:
		sandbox:x:$SANDBOX_GID:
		nogroup:x:65534:
	EOF
	echo sandbox >"$r/etc/hostname"
	chmod 0700 "$r/root"
	chmod 1777 "$r/tmp" "$r/var/tmp"
	chown "$SANDBOX_UID:$SANDBOX_GID" "$r/workspace" "$r/home/sandbox"

	# Fixed mtimes make the busybox image byte-for-byte reproducible for one busybox version.
	write_oci_tar "$r" "$BUSYBOX_REF" "$CORRAL_IMAGES/busybox.oci.tar" /bin/sh --mtime=@0
	echo "$key" >"$CORRAL_IMAGES/busybox.oci.tar.key"
	log "busybox image built in $(elapsed "$start") s"
}

# ---- debian ------------------------------------------------------------------------------------------
# debian_mirror: the Debian archive this host's apt uses (apt's own parsing of sources.list and
# sources.list.d, both formats), preferring the entry for $DEBIAN_SUITE. CORRAL_DEBIAN_MIRROR
# overrides it.
debian_mirror() {
	if [[ -n ${CORRAL_DEBIAN_MIRROR:-} ]]; then
		echo "$CORRAL_DEBIAN_MIRROR"
		return
	fi
	# shellcheck disable=SC2016 # $(...) here is apt's field syntax, not the shell's
	apt-get indextargets --format '$(TARGET_OF) $(RELEASE) $(REPO_URI)' 2>/dev/null |
		awk -v suite="$DEBIAN_SUITE" '
			$1 != "deb" { next }
			$2 == suite && !exact { exact = $3 }
			$2 !~ /[-\/]/ && !plain { plain = $3 }
			END { if (exact) print exact; else if (plain) print plain }'
}

build_debian() { build_debootstrap debian "$DEBIAN_RECIPE" "$DEBIAN_REF" ""; }
build_node() { build_debootstrap node "$NODE_RECIPE" "$NODE_REF" "$NODE_PACKAGES"; }

# build_debootstrap NAME RECIPE REF PACKAGES: a minbase Debian with DEBIAN_INCLUDE, and PACKAGES
# (space-separated) installed into it with apt-get, as NAME.oci.tar.
build_debootstrap() {
	need_cmd debootstrap chroot apt-get
	local name=$1 recipe=$2 ref=$3 extra=$4 include=$DEBIAN_INCLUDE
	local key work r mirror start
	key="recipe=$recipe ref=$ref suite=$DEBIAN_SUITE include=$include${extra:+ packages=$extra}"
	if up_to_date "$name" "$key"; then
		log "$name image up to date: $CORRAL_IMAGES/$name.oci.tar ($ref)"
		return
	fi
	mirror="$(debian_mirror)"
	[[ -n $mirror ]] || die "found no Debian archive in apt's sources (set CORRAL_DEBIAN_MIRROR to one)"
	# debootstrap downloads with wget, which does not read apt's proxy setting: pass it on.
	local http_proxy="${http_proxy:-}"
	[[ -n $http_proxy ]] || eval "$(apt-config shell http_proxy Acquire::http::Proxy)"
	[[ -z $http_proxy ]] || export http_proxy

	start="$(date +%s.%N)"
	work="$(mktemp -d "$CORRAL_IMAGES/.$name-XXXXXX")"
	WORKDIRS+=("$work")
	r="$work/rootfs"
	log "debootstrap $DEBIAN_SUITE (minbase + $include) from $mirror — a few minutes; log: $CORRAL_LOGS/debootstrap-$name.log"
	mkdir -p "$CORRAL_LOGS"
	if ! debootstrap --variant=minbase --include="$include" \
		"$DEBIAN_SUITE" "$r" "$mirror" >"$CORRAL_LOGS/debootstrap-$name.log" 2>&1; then
		tail -n 20 "$CORRAL_LOGS/debootstrap-$name.log" >&2 || true
		[[ -f $r/debootstrap/debootstrap.log ]] && tail -n 20 "$r/debootstrap/debootstrap.log" >&2
		die "debootstrap failed (log: $CORRAL_LOGS/debootstrap-$name.log)"
	fi
	log "debootstrap done in $(elapsed "$start") s"
	if [[ -n $extra ]]; then
		log "installing $extra into the $name image"
		echo "deb $mirror $DEBIAN_SUITE main" >"$r/etc/apt/sources.list"
		# shellcheck disable=SC2086 # $extra is a list of package names
		if ! { chroot "$r" apt-get update && DEBIAN_FRONTEND=noninteractive chroot "$r" apt-get install -y --no-install-recommends $extra; } \
			>>"$CORRAL_LOGS/debootstrap-$name.log" 2>&1; then
			tail -n 20 "$CORRAL_LOGS/debootstrap-$name.log" >&2 || true
			die "installing $extra failed (log: $CORRAL_LOGS/debootstrap-$name.log)"
		fi
		rm -f "$r/etc/apt/sources.list"
	fi

	chroot "$r" groupadd --gid "$SANDBOX_GID" sandbox
	chroot "$r" useradd --uid "$SANDBOX_UID" --gid "$SANDBOX_GID" --create-home \
		--shell /bin/bash sandbox
	install -d -m 0755 -o "$SANDBOX_UID" -g "$SANDBOX_GID" "$r/workspace"
	echo sandbox >"$r/etc/hostname"
	: >"$r/etc/resolv.conf"
	# Package downloads and indexes only add size; sandboxes have no network to use them.
	rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/*.bin "$r"/var/lib/apt/lists/*
	mkdir -p "$r/var/lib/apt/lists/partial"
	find "$r/var/log" -type f -delete

	write_oci_tar "$r" "$ref" "$CORRAL_IMAGES/$name.oci.tar" /bin/bash
	echo "$key" >"$CORRAL_IMAGES/$name.oci.tar.key"
	log "$name image built in $(elapsed "$start") s"
}

main() {
	local want=("$@") i
	((${#want[@]})) || want=(busybox debian node)
	for i in "${want[@]}"; do
		case "$i" in
		busybox) build_busybox ;;
		debian) build_debian ;;
		node) build_node ;;
		*) die "unknown image '$i' (known: busybox debian node)" ;;
		esac
	done
	for i in "${want[@]}"; do
		printf '%s\t%s\n' "$CORRAL_IMAGES/$i.oci.tar" "$(cut -d' ' -f2 "$CORRAL_IMAGES/$i.oci.tar.key" | sed 's/^ref=//')"
	done
}

# One line, so a run never reads past it even if this file is edited meanwhile.
main "$@"; exit
