# fleetcheck — see README.md. `make help` lists the targets.
GO        ?= go
BIN       := bin/fleetcheck
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
# Pinned protobuf toolchain (protoc itself is Debian's protobuf-compiler 3.21.12).
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GOBIN_DIR := $(CURDIR)/bin/tools
# Pinned linter, built from the Go module proxy with this tree's Go; the
# binary's name carries the version, so a bump installs the new one.
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT         := $(GOBIN_DIR)/golangci-lint-$(GOLANGCI_LINT_VERSION)
FUZZTIME  ?= 60s

.PHONY: help build test test-short e2e e2e-short bench demo demo-bundles proto proto-check lint fuzz clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

build: ## build bin/fleetcheck
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/fleetcheck

# The slim node build: run, collect, analyze, checks, agent; no client-go,
# SQLite, campaign engines or simulator (cmd/fleetcheck/nodebuild_test.go).
# grpcnotrace leaves out gRPC's x/net/trace debug pages (3.7 MB of binary,
# unused by the agent).
NODE_BIN := bin/fleetcheck-node
NODE_TAGS := node,grpcnotrace
NODE_LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: build-node package bench-node
build-node: ## build bin/fleetcheck-node: the slim node binary, stripped, -trimpath (-tags node)
	$(GO) build -tags $(NODE_TAGS) -trimpath -ldflags '$(NODE_LDFLAGS)' -o $(NODE_BIN) ./cmd/fleetcheck

# Debian version: a release tag's number, else 0.0.0~gitDATE.COMMIT.
DEB_VERSION ?= $(shell git describe --tags --exact-match 2>/dev/null | sed -n 's/^v\([0-9].*\)/\1/p' | grep . || echo 0.0.0~git$$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S 2>/dev/null || echo 0).$$(git rev-parse --short HEAD 2>/dev/null || echo dev))
package: build build-node ## write dist/fleetcheck-node_*.deb and dist/fleetcheck-coordinator_*.deb (docs/deploy.md)
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || date +%s) \
	  $(GO) run ./cmd/fleetcheck-package -version '$(DEB_VERSION)' -node-binary $(NODE_BIN) -full-binary $(BIN) -out dist

bench-node: build build-node ## node build vs full build: size, analyze CPU and peak RSS, idle agent RSS (docs/scale.md)
	./scripts/bench-node-build.sh

test: ## run the test suite with the race detector (no GPU, network or root needed); events with per-package durations in bin/test.json
	$(GO) vet ./...
	@mkdir -p bin
	$(GO) build -o bin/testsum ./scripts/testsum
	bash -o pipefail -c '$(GO) test -race -count=1 -timeout 20m -json ./... | tee bin/test.json | bin/testsum'

test-short: ## tests without the race detector
	$(GO) test -count=1 ./...

e2e: ## the staging fleet: the real binary as a coordinator and agents on simulated nodes, every campaign through the CLI, processes killed mid-way (minutes)
	$(GO) vet -tags e2e ./e2e/
	$(GO) test -tags e2e -count=1 -timeout 30m -v ./e2e/

e2e-short: ## the part of make e2e that CI runs (about 3 minutes on 2 cores)
	$(GO) vet -tags e2e ./e2e/
	$(GO) test -tags e2e -short -count=1 -timeout 8m ./e2e/

.PHONY: chaos chaos-short
chaos: ## the HA chaos suite: 3 coordinator processes, one PostgreSQL, 16 agents; a rollout, a sweep, a burn-in and the rollback under 24 seeded faults (kill -9, SIGSTOP, database restarts; FLEETCHECK_CHAOS_SEED reruns a schedule; about 5 minutes)
	$(GO) vet -tags e2e,chaos ./e2e/
	$(GO) test -tags e2e,chaos -count=1 -timeout 60m -v -run '^TestChaos' ./e2e/

chaos-short: ## the part of make chaos that CI runs: the same fleet, rollout, sweep and burn-in under 7 faults, every kind at least once, the leader killed twice (about 4 minutes on 2 cores)
	$(GO) vet -tags e2e,chaos ./e2e/
	$(GO) test -tags e2e,chaos -short -count=1 -timeout 15m -v -run '^TestChaos' ./e2e/

.PHONY: test-browser console-screenshots
test-browser: ## the web console in headless chromium (chromedp): a coordinator with mTLS and simulated agents on 127.0.0.1 (about 15 s)
	$(GO) vet -tags browser ./coordinator/console/
	$(GO) test -tags browser -count=1 -timeout 3m -run Browser ./coordinator/console/

console-screenshots: ## retake docs/console/*.png (the browser suite with CONSOLE_SCREENSHOTS set)
	CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console $(GO) test -tags browser -count=1 -timeout 3m -run Browser ./coordinator/console/

bench: ## benchmarks: analyze of an 8-GPU bundle and of the largest accepted kernel log (256 MiB), each parser, ingest; campaigns once each on the virtual clock
	$(GO) test -run '^$$' -bench . -benchmem ./node/inspect/ ./node/probe/... ./node/host/... ./node/host/sim/ ./coordinator/store/ ./coordinator/
	$(GO) test -run '^$$' -bench . -benchtime 1x ./campaigns/sweep/ ./campaigns/rollout/ ./campaigns/burnin/ ./campaigns/drill/
	$(GO) test -run '^$$' -bench RemediationScenarioFullSize -benchtime 1x ./sim/demo/

demo: build ## the main job on the embedded default: a coordinator and 16 simulated nodes, faults, a fleet check
	./$(BIN) demo

demo-bundles: build ## analyze the example support bundles (a healthy node and two broken ones)
	./scripts/demo.sh

lint: $(GOLANGCI_LINT) ## gofmt, go vet and golangci-lint (.golangci.yml: staticcheck, errcheck, revive, depguard import rules)
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'); exit 1; }
	$(GO) vet ./...
	$(GOLANGCI_LINT) run ./...

fuzz: ## fuzz every parser for FUZZTIME each (default 60s)
	./scripts/fuzz.sh $(FUZZTIME)

clean:
	rm -rf bin dist

$(GOLANGCI_LINT):
	GOBIN=$(GOBIN_DIR) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(GOBIN_DIR)/golangci-lint $@

$(GOBIN_DIR)/protoc-gen-go:
	GOBIN=$(GOBIN_DIR) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(GOBIN_DIR)/protoc-gen-go-grpc:
	GOBIN=$(GOBIN_DIR) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

proto: $(GOBIN_DIR)/protoc-gen-go $(GOBIN_DIR)/protoc-gen-go-grpc ## regenerate proto/ Go code with the pinned tools
	PATH=$(GOBIN_DIR):$$PATH protoc -I proto \
	  --go_out=proto --go_opt=paths=source_relative \
	  --go-grpc_out=proto --go-grpc_opt=paths=source_relative \
	  proto/fleetcheck/v1/fleetcheck.proto proto/fleetcheck/v1/campaigns.proto proto/fleetcheck/v1/remediation.proto proto/fleetcheck/v1/routing.proto

proto-check: proto ## fail when regeneration would change a committed file
	git diff --exit-code -- proto/

.PHONY: bench-bundle-limits
bench-bundle-limits: ## peak RSS and wall time of analyze on bundles at and past the limits: normal, gzip bomb, 256 MiB dmesg, largest accepted (docs/scale.md)
	./scripts/bench-bundle-limits.sh

.PHONY: bench-fleet
bench-fleet: ## fleet figures: coordinator process + 1,000 and 10,000 simulated agents (docs/scale.md; minutes)
	./scripts/bench-fleet.sh
