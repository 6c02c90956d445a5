#!/usr/bin/env bash
# chromium.sh — the browser the web console's tests drive (test/integration/console).
#
#   scripts/runtime/chromium.sh      # idempotent; a second run only checks
#
# Installs Debian's `chromium` package (/usr/bin/chromium) when it is missing. Only the tests use
# it: they run it headless through the DevTools protocol (chromedp) against a node they start.
# apt's package cache is the cache here; nothing is built.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"

lock chromium

main() {
	if dpkg -s chromium >/dev/null 2>&1 && [[ -x /usr/bin/chromium ]]; then
		log "chromium present: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
		return
	fi
	need_root "installing chromium"
	log "installing Debian's chromium package"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends chromium >/dev/null
	[[ -x /usr/bin/chromium ]] || die "the chromium package installed no /usr/bin/chromium"
	log "chromium installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
}

main "$@"
