# vmnetctl: `make demo` runs the main job, `make test` runs every test.
GO ?= go
BIN := bin/vmnetctl


.PHONY: build demo demo-down test test-unit check-darwin fuzz clean

build:
	$(GO) build -o $(BIN) ./cmd/vmnetctl

# The main job with the built-in default networks: show them, validate the
# example VM files, then (as root) bring their networks and helpers up, show
# the status and the qemu arguments of one VM. `make demo-down` undoes it.
demo: build
	$(BIN) networks
	$(BIN) validate -f examples/default/lima.yaml -f examples/vms.yaml
	@if [ "$$(id -u)" -ne 0 ]; then echo "run as root (sudo make demo) to bring the example networks up"; exit 0; fi; \
	  set -e; $(BIN) up -f examples/vms.yaml; echo; $(BIN) status; echo; \
	  echo "qemu arguments for VM web:"; $(BIN) args web --vmm qemu; echo; \
	  echo "Undo with: sudo make demo-down"

demo-down: build
	$(BIN) down -f examples/vms.yaml

# Every test: installs what the tests need (test/setup.sh, as root), then
# unit, data-plane, helper and end-to-end tests (those that need root skip
# without it), the fuzzers' seed corpora, and the macOS build.
test:
	test/setup.sh
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 30m ./...
	$(MAKE) check-darwin

test-unit:
	$(GO) test -count=1 ./api/... ./config/... ./cmd/...

check-darwin:
	GOOS=darwin $(GO) vet ./...
	GOOS=darwin $(GO) build ./...

# Run each fuzzer for a while (the seed corpora run in `make test`).
FUZZTIME ?= 60s
fuzz:
	cd api && $(GO) test -run '^$$' -fuzz FuzzLoadNetworks -fuzztime $(FUZZTIME) .
	cd api && $(GO) test -run '^$$' -fuzz FuzzLoadVMFile -fuzztime $(FUZZTIME) .

clean:
	rm -rf bin
