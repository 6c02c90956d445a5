# corral's build. Two commands matter to a new user:
#   make up    install what is missing, build, and run corral on this machine
#   make test  every test, unit and integration
GO       ?= go
BIN      := bin/corral
DATA_DIR ?= .corral
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS  := -X corral.dev/corral/internal/version.Version=$(VERSION)
# Generated code, checked by `make verify`.
GENERATED := proto/gen controlplane/store/internal/db

.PHONY: up deps runtime s3server chromium build test test-race generate verify lint bench clean

up: deps runtime build
	$(BIN) dev --data-dir $(DATA_DIR)

deps:
	@scripts/deps.sh

# The sandbox runtime: static runsc and containerd builds (cached under
# /var/cache/corral), the busybox and Debian images, a private containerd,
# and one throwaway gVisor sandbox: the very first one after a boot has been
# seen to fail once here (systrap attach, RUNTIME-NOTES), and that should
# not be a test's sandbox. A failure is reported, not hidden.
# Needs root; without it the containerd tests skip (and fail under CI).
runtime:
	@if [ "$$(id -u)" -eq 0 ]; then \
		scripts/runtime/install.sh && scripts/runtime/images.sh && scripts/runtime/containerd.sh start && \
		{ scripts/runtime/containerd.sh ctr run --rm --runtime io.containerd.runc.v2 \
			--runc-binary /var/cache/corral/bin/runsc localhost/corral/busybox:1 corral-warmup-$$$$ true \
		  || echo "runtime: warning: the first gVisor sandbox on this boot failed (see above); tests will show whether it persists" >&2; }; \
	elif [ -n "$$CI" ]; then \
		echo "runtime: error: CI needs the sandbox runtime, which needs root" >&2; exit 1; \
	else \
		echo "runtime: not root: not setting up containerd and gVisor; their tests will skip" >&2; \
	fi

# A real S3 server for the S3 blob store's tests (SeaweedFS, built once and
# cached under /var/cache/corral: scripts/runtime/s3.sh). Only tests and
# benchmarks use it; `make up` keeps blobs in a local directory.
s3server:
	@if [ "$$(id -u)" -eq 0 ]; then \
		scripts/runtime/s3.sh; \
	elif [ -n "$$CI" ]; then \
		echo "s3server: error: CI needs the S3 server, which is built as root" >&2; exit 1; \
	else \
		echo "s3server: not root: not building the S3 server; its tests will skip" >&2; \
	fi

# Chromium for the web console's browser tests (Debian's package, installed
# only when missing: scripts/runtime/chromium.sh). Only tests use it.
chromium:
	@if [ "$$(id -u)" -eq 0 ]; then \
		scripts/runtime/chromium.sh; \
	elif [ -n "$$CI" ]; then \
		echo "chromium: error: CI needs Chromium, which is installed as root" >&2; exit 1; \
	else \
		echo "chromium: not root: not installing Chromium; the console's browser tests skip without it" >&2; \
	fi

# bin/corral-spawn is the compiled spawner pausable sandboxes mount (corral
# host --spawn-binary looks for it beside corral): static, no libc inside.
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/corral
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o bin/corral-spawn ./cmd/corral-spawn
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/terraform-provider-corral ./cmd/terraform-provider-corral

test: deps runtime s3server chromium
	$(GO) test -count=1 -timeout 30m ./...

test-race: deps runtime s3server chromium
	$(GO) test -count=1 -race -timeout 45m ./...

generate:
	$(GO) tool sqlc generate
	cd proto && $(GO) tool buf generate

verify: generate
	@git add -N $(GENERATED) >/dev/null 2>&1 || true
	@if ! git diff --quiet -- $(GENERATED); then \
		echo "generated code is out of date; run 'make generate' and commit:"; \
		git diff --stat -- $(GENERATED); exit 1; fi
	$(GO) mod tidy -diff
	@echo "verify: generated code and go.mod are up to date"

lint:
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	cd proto && $(GO) tool buf lint

bench: deps runtime s3server
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./...

clean:
	rm -rf bin
