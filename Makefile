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

.PHONY: up deps build test test-race generate verify lint bench clean

up: deps build
	$(BIN) dev --data-dir $(DATA_DIR)

deps:
	@scripts/deps.sh

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/corral

test: deps
	$(GO) test -count=1 -timeout 30m ./...

test-race: deps
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

bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./...

clean:
	rm -rf bin
