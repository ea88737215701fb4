# hl7gw — every target is what CI and the README use. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
FUZZ_SECONDS ?= 60
.DEFAULT_GOAL := help

.PHONY: help run test lint fmt bench build fuzz fuzz-smoke

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

build: ## build every binary (release)
	$(CARGO) build --release --workspace --bins

run: build ## run hl7gw on this machine: flat view, ACK, and an MLLP send to a local receiver
	@scripts/run-demo.sh

test: lint ## fmt check, clippy -D warnings, then every test (unit, property, corpus, integration)
	$(CARGO) test --workspace --all-targets
	$(CARGO) test --workspace --doc

lint: ## cargo fmt --check and clippy with -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## format the code
	$(CARGO) fmt --all

bench: ## criterion benchmarks: hl7v2 against hl7-parser and rust-hl7 (see docs/BENCHMARKS.md)
	$(CARGO) bench -p hl7v2 --bench parse

fuzz: ## fuzz the parser and the MLLP decoder for FUZZ_SECONDS each (needs nightly; installs cargo-fuzz)
	@scripts/fuzz.sh $(FUZZ_SECONDS)
