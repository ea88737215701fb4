# hl7gw — every target is what CI and the README use. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
FUZZ_SECONDS ?= 60
.DEFAULT_GOAL := help

.PHONY: help run demo test lint fmt bench bench-e2e build fuzz kafka-up kafka-down

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

build: ## build every binary (release)
	$(CARGO) build --release --workspace --bins

run: build ## start the local Kafka and the ingress on 127.0.0.1:2575, send the samples, keep running (Ctrl-C stops)
	@scripts/run.sh

demo: build ## the CLI alone: flat view, ACK, and an MLLP send to a local `hl7gw receive`
	@scripts/run-demo.sh

test: lint ## fmt check, clippy -D warnings, then every test (unit, property, corpus, e2e with a real Kafka)
	@scripts/test.sh

kafka-up: ## start the local single-node Kafka (KRaft) on 127.0.0.1:9092 (KAFKA_PORT to change)
	@scripts/kafka.sh up

kafka-down: ## stop the local Kafka
	@scripts/kafka.sh down

lint: ## cargo fmt --check and clippy with -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## format the code
	$(CARGO) fmt --all

bench: ## criterion benchmarks: hl7v2 against hl7-parser and rust-hl7 (see docs/BENCHMARKS.md)
	$(CARGO) bench -p hl7v2 --bench parse

bench-e2e: ## the ingress in release under hl7gw-load, fast and durable, with a local Kafka (docs/BENCHMARKS.md)
	@scripts/bench-e2e.sh

fuzz: ## fuzz the parser and the MLLP decoder for FUZZ_SECONDS each (needs nightly; installs cargo-fuzz)
	@scripts/fuzz.sh $(FUZZ_SECONDS)

.PHONY: cluster-up cluster-down tools

cluster-up: ## start a local Kubernetes v1.36.3 control plane on 127.0.0.1:6443 (builds it once; see scripts/cluster.sh)
	@scripts/cluster.sh up

cluster-down: ## stop the local Kubernetes control plane
	@scripts/cluster.sh down

tools: ## install helm, kubeconform (with offline Kubernetes schemas) and promtool into .cache/tools
	@scripts/tools.sh
