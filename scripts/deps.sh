#!/usr/bin/env bash
# Installs what corral's control plane and its tests need on a Debian machine,
# by package name, and only what is missing: PostgreSQL's server binaries.
# The sandbox runtime (containerd, runsc, images) is scripts/runtime/install.sh.
set -euo pipefail

packages=(postgresql gcc git make)
missing=()
for p in "${packages[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
	exit 0
fi
echo "deps: installing ${missing[*]}" >&2
sudo=()
if [[ $(id -u) -ne 0 ]]; then
	command -v sudo >/dev/null || { echo "deps: error: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
	sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts a system cluster on install; corral runs its own private
# clusters and does not use it.
