# vmnetctl: `make demo` runs the main job, `make test` runs every test.
# go, else Go's own install dir: sudo's secure_path (sudo make demo) often
# lacks /usr/local/go/bin, as test/setup.sh knows too.
ifeq ($(origin GO),undefined)
GO := $(shell command -v go 2>/dev/null || { [ -x /usr/local/go/bin/go ] && echo /usr/local/go/bin/go; } || echo go)
endif
# Where the binary and the packages' generated files (man pages,
# completions) go: overridable, so a test builds outside the source tree.
BIN ?= bin/vmnetctl
PKG_BUILD ?= build/pkg

# Tools the checks need, installed by `go install` into bin/tools on first
# use (not by test/setup.sh: they are Go programs, pinned here).
# staticcheck 2026.2.2 is v0.8.2 of honnef.co/go/tools; it builds with Go 1.26.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := bin/tools/staticcheck-$(STATICCHECK_VERSION)/staticcheck

# nfpm builds the .deb and .rpm (make packages).
NFPM_VERSION := v2.45.2
NFPM := bin/tools/nfpm-$(NFPM_VERSION)/nfpm
# The packages' version, and the binary's: the release in
# cmd/vmnetctl/version.go with the commit, as the binary derives it when
# built without make (one version string, whoever builds).
PKG_VERSION ?= $(shell v=$$(sed -n 's/^const release = "\(.*\)"$$/\1/p' cmd/vmnetctl/version.go); echo "$${v:-0.0.0}+git$$(git rev-parse --short=7 HEAD 2>/dev/null || echo unknown)")
PKG_ARCH ?= $(shell $(GO) env GOARCH)
DIST ?= dist

.PHONY: build demo package packages demo-down test test-unit check-darwin lint fuzz fuzz-smoke fuzz-list bench bench-smoke clean

build:
	$(GO) build -ldflags "-X main.version=v$(PKG_VERSION)" -o $(BIN) ./cmd/vmnetctl
	CGO_ENABLED=0 $(GO) build -o $(BIN)-relay ./cmd/vmnetctl-relay
	chmod 0711 $(BIN)-relay
	$(GO) build -o $(BIN)-helper ./cmd/vmnetctl-helper

# The main job with the built-in default networks: show them, validate the
# example VM files, then (as root) install nftables if it is missing, bring
# the example networks and helpers up, show the status and the qemu
# arguments of one VM. `make demo-down` undoes it. `vmnetctl doctor` says
# what else the host lacks.
demo: build
	@if [ "$$(id -u)" -eq 0 ] && ! command -v nft >/dev/null; then \
	  echo "installing nftables (the nft command vmnetctl's data plane runs)"; \
	  if command -v apt-get >/dev/null; then apt-get update -qq >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null; \
	  elif command -v dnf >/dev/null; then dnf install -y -q nftables; \
	  else echo "vmnetctl needs the nft command: install nftables with your package manager" >&2; exit 1; fi; fi
	$(BIN) networks
	$(BIN) validate -f examples/default/lima.yaml -f examples/vms.yaml
	@if [ "$$(id -u)" -ne 0 ]; then echo "run as root (sudo make demo) to bring the example networks up"; exit 0; fi; \
	  set -e; $(BIN) up -f examples/vms.yaml; echo; $(BIN) status; echo; \
	  echo "qemu arguments for VM web:"; $(BIN) args web --vmm qemu; echo; \
	  echo "Undo with: sudo make demo-down"

demo-down: build
	$(BIN) down -f examples/vms.yaml

# Every test: installs what the tests need (test/setup.sh, as root), then
# vet and staticcheck (linux and darwin), unit, data-plane, helper and
# end-to-end tests (those that need root skip without it) with the fuzzers'
# seed corpora, the macOS build, every fuzzer for a few seconds, and a short
# run of the throughput benchmark.
test:
	test/setup.sh
	$(GO) vet ./...
	$(MAKE) lint
	$(GO) test -count=1 -timeout 30m ./...
	$(MAKE) check-darwin
	$(MAKE) fuzz-smoke
	$(MAKE) bench-smoke

# The throughput benchmark for about a second per path and direction: every
# path must move data and the helpers' counters must agree with iperf3.
bench-smoke:
	CI=$${CI:-} VMNETCTL_BENCH=smoke $(GO) test -count=1 ./bench -run '^TestThroughput$$'

# The full benchmark, as docs/performance.md reports it.
bench:
	VMNETCTL_BENCH=1 $(GO) test -count=1 -v ./bench -run '^TestThroughput$$' -timeout 20m

# .deb and .rpm into dist/: the binary, the default networks.yaml as
# /etc/vmnetctl/networks.yaml (a config file: an edited one is kept on
# upgrade), the systemd unit, man pages and shell completions generated from
# the commands, the docs (packaging/nfpm.yaml; docs/install.md).
package: packages

# SOURCE_DATE_EPOCH (reproducible builds: the man pages' date, nfpm's file
# times) is the last commit's time unless given.
packages: export SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
packages: build $(NFPM)
	rm -rf $(PKG_BUILD) && mkdir -p $(PKG_BUILD)/man $(PKG_BUILD)/completions $(DIST)
	$(BIN) man $(PKG_BUILD)/man
	gzip -9n $(PKG_BUILD)/man/*.8
	$(BIN) completion bash > $(PKG_BUILD)/completions/vmnetctl.bash
	$(BIN) completion zsh > $(PKG_BUILD)/completions/_vmnetctl
	$(BIN) completion fish > $(PKG_BUILD)/completions/vmnetctl.fish
	for p in deb rpm; do VERSION=$(PKG_VERSION) ARCH=$(PKG_ARCH) BIN=$(BIN) PKG_BUILD=$(PKG_BUILD) $(NFPM) package -f packaging/nfpm.yaml -p $$p -t $(DIST)/ || exit 1; done

$(NFPM):
	GOOS= GOARCH= GOBIN=$(CURDIR)/$(dir $@) $(GO) install github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION)

test-unit:
	$(GO) test -count=1 ./api/... ./config/... ./cmd/...

check-darwin:
	GOOS=darwin $(GO) vet ./...
	GOOS=darwin $(GO) build ./...

# staticcheck for Linux and macOS: code used on one system only must be
# built for that system only (build tags), or it shows as unused on the other.
lint: $(STATICCHECK)
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt: these files are not formatted:"; echo "$$unformatted"; exit 1; fi
	@status=0; for os in linux darwin; do \
	  echo "GOOS=$$os $(STATICCHECK) ./..."; GOOS=$$os $(STATICCHECK) ./... || status=1; \
	done; exit $$status

$(STATICCHECK):
	GOOS= GOARCH= GOBIN=$(CURDIR)/$(dir $@) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# Every fuzz target of the tree, one "PACKAGE:TARGET" per line: the Fuzz
# functions of each package's test files for this system (go list applies
# the build constraints), so a new fuzzer is fuzzed without a change here.
FUZZ_TEST_FILES = $(GO) list -f '{{$$p := .ImportPath}}{{$$d := .Dir}}{{range .TestGoFiles}}{{$$p}} {{$$d}}/{{.}}{{"\n"}}{{end}}{{range .XTestGoFiles}}{{$$p}} {{$$d}}/{{.}}{{"\n"}}{{end}}' ./...
FUZZ_TARGETS = set -e; files=$$($(FUZZ_TEST_FILES)); \
	targets=$$(echo "$$files" | while read -r pkg file; do \
	  [ -z "$$file" ] || sed -n "s|^func \(Fuzz[A-Za-z0-9_]*\)([A-Za-z0-9_]* \*testing\.F).*|$$pkg:\1|p" "$$file"; done); \
	[ -n "$$targets" ] || { echo "no fuzz targets found" >&2; exit 1; }

fuzz-list:
	@$(FUZZ_TARGETS); echo "$$targets"

# Fuzz every target for FUZZTIME, one after the other; a failure is
# reported at the end, its input saved under the package's testdata/fuzz.
# The seed corpora also run in every `go test`. Go 1.26's fuzzing
# coordinator can end a run at the deadline with a bare "context deadline
# exceeded" and no failing input (go.dev/issue/75804, fixed in Go 1.27):
# such a run is said so and repeated, up to three runs, never passed over.
FUZZTIME ?= 60s
fuzz:
	@$(FUZZ_TARGETS); failed=; log=$$(mktemp); trap 'rm -f "$$log" "$$log.rc"' EXIT; \
	for t in $$targets; do \
	  pkg=$${t%:*}; fn=$${t##*:}; run=1; \
	  while :; do \
	    echo "== $$fn ($$pkg), $(FUZZTIME)"; \
	    { if $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) "$$pkg"; then echo ok >"$$log.rc"; else echo failed >"$$log.rc"; fi; } 2>&1 | tee "$$log"; \
	    [ "$$(cat "$$log.rc")" = failed ] || break; \
	    if [ $$run -lt 3 ] && grep -q '^    context deadline exceeded$$' "$$log" && \
	       ! grep -q -e 'Failing input written' -e 'seed corpus entry' "$$log"; then \
	      echo "== $$fn: no failing input, the coordinator's deadline race (go.dev/issue/75804): run $$((run + 1)) of at most 3"; \
	      run=$$((run + 1)); continue; \
	    fi; \
	    failed="$$failed $$t"; break; \
	  done; \
	done; \
	[ -z "$$failed" ] || { echo "fuzzing failed:$$failed" >&2; exit 1; }

# The short run CI does (and `make test`): every fuzzer for a few seconds.
FUZZSMOKETIME ?= 3s
fuzz-smoke:
	$(MAKE) fuzz FUZZTIME=$(FUZZSMOKETIME)

clean:
	rm -rf bin
