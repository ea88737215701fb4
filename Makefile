# hl7gw — every target is what CI and the README use. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
FUZZ_SECONDS ?= 60
.DEFAULT_GOAL := help

.PHONY: bench-broker-profile bench-egress bench-pipeline-fhir bench-hostile bench-node bench-peers bench-pipeline bench-routing help run demo test lint fmt bench bench-e2e build fuzz kafka-up kafka-down

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

build: ## build every binary (release)
	$(CARGO) build --release --workspace --bins

run: build ## the whole gateway locally: Kafka, ingress :2575, transformer, egress to a receiver folder; sends the samples (KAFKA_BROKERS=host:port: your Kafka, no Java; RUN_ONCE=1: stop once delivered)
	@scripts/run.sh

demo: build ## the CLI alone: flat view, ACK, and an MLLP send to a local `hl7gw receive`
	@scripts/run-demo.sh

# No incremental caches for make test (lint runs under it too): a clean build's incremental directories were
# gigabytes that only a later edit-and-rebuild would use, and CI's disk ran out. (Cargo keeps the workspace's own
# crates built this way apart from those of a plain `cargo test`: switching between the two rebuilds them.)
test: export CARGO_INCREMENTAL = 0
test: lint ## fmt check, clippy -D warnings, then every test (unit, property, corpus, e2e with a real Kafka)
	@scripts/test.sh

.PHONY: test-quick
test-quick: ## fmt check, clippy -D warnings, and the tests that need no broker, root or network: unit tests of every crate (the config schemas and reference current), the example configs' --check-config, the parser's property and corpus tests, doc tests (make test runs everything)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test --workspace --lib --bins
	$(CARGO) test -p hl7gw-ingress -p hl7gw-transformer -p hl7gw-egress --test example_config
	$(CARGO) test -p hl7v2 --all-targets
	$(CARGO) test --workspace --doc

kafka-up: ## start the local single-node Kafka (KRaft) on 127.0.0.1:9092 (KAFKA_PORT to change)
	@scripts/kafka.sh up

kafka-down: ## stop the local Kafka
	@scripts/kafka.sh down

.PHONY: kafka-cluster-up kafka-cluster-down

kafka-cluster-up: ## a 3-node KRaft cluster for failover tests on 127.0.0.1:9092,9102,9112 (KAFKA_NODES, KAFKA_PORT)
	@KAFKA_NODES=$${KAFKA_NODES:-3} scripts/kafka.sh up

kafka-cluster-down: ## stop the local Kafka cluster
	@KAFKA_NODES=$${KAFKA_NODES:-3} scripts/kafka.sh down

lint: ## cargo fmt --check, clippy with -D warnings, no unused dependency (cargo-machete), licences/bans/sources (cargo-deny, deny.toml), advisories when .cache/ holds the RustSec database, no import circle, docs/architecture.md true to cargo metadata
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@scripts/deps-check.sh
	@python3 scripts/imports-check.py
	@python3 scripts/arch-check.py

.PHONY: advisories
advisories: ## fetch the RustSec advisory database into .cache/ (needs GitHub, or ADVISORY_DB=<a clone>) and check the dependencies against it; make lint then checks it offline
	@scripts/deps-check.sh advisories

fmt: ## format the code
	$(CARGO) fmt --all

bench: ## criterion benchmarks: hl7v2 against hl7-parser and rust-hl7 (see docs/BENCHMARKS.md)
	$(CARGO) bench -p hl7v2 --bench parse

bench-routing: ## criterion: the transformer's route dispatch with 1, 10, 100 and 1,000 routes (indexed vs. scan)
	$(CARGO) bench -p hl7gw-transformer --bench routing

bench-e2e: ## the ingress in release under hl7gw-load, fast and durable, 1/4/8 clients x 30 s, with a local Kafka: msg/s, latency, CPU µs/msg of ingress, broker, load client
	@scripts/bench-e2e.sh

bench-peers: ## the same load against an echo floor, hl7gw fast/durable and Camel 4 MLLP->Kafka routes: msg/s, p50/p99, CPU µs/msg per process
	@scripts/bench-peers.sh

bench-pipeline: ## the whole pipeline in release: max run (BENCH_SECONDS 30) and a latency curve at fixed rates; delivered msg/s, e2e p50/p99, CPU µs per delivered message per process, zero lost
	@scripts/bench-pipeline.sh

bench-pipeline-fhir: ## bench-pipeline with every ADT also converted to a FHIR Bundle (toFhir) and POSTed over HTTP: the max run only by default
	@BENCH_FHIR=1 BENCH_RATES="$${BENCH_RATES-}" scripts/bench-pipeline.sh

bench-egress: ## the egress alone in release draining a backlog into a receiver answering in 5/50/100/200 ms, MLLP and HTTP, one in flight per partition vs. the defaults: delivered msg/s, egress CPU µs/msg (issue 38)
	@scripts/bench-egress.sh

bench-broker-profile: ## bench-pipeline's max run and 1,000 msg/s with the broker profiled: its CPU per delivered message by cause (request handling by API, log appends, network, GC...) and the requests it answered
	@BENCH_BROKER_PROFILE=1 BENCH_RATES="$${BENCH_RATES-1000}" scripts/bench-pipeline.sh

bench-hostile: ## a normal sender beside 1,100 hostile clients per abuse (slow, idle, never-reading, idle gRPC) against the release ingress: msg/s, latency, errors, RSS, what the ingress closed
	@scripts/bench-hostile.sh

bench-node: ## the in-cluster load Job (k8s/loadtest, 8 clients, 30 s) on the local node, release image: msg/s, latency, ACK codes
	@scripts/node-check.sh bench

fuzz: ## fuzz the parser and the MLLP decoder for FUZZ_SECONDS each (needs nightly; installs cargo-fuzz)
	@scripts/fuzz.sh $(FUZZ_SECONDS)

.PHONY: cluster-up cluster-down tools

cluster-up: ## a local Kubernetes v1.36.3 control plane on 127.0.0.1:6443 and a Ready node (containerd, kubelet, scheduler; scripts/node.sh), the hl7gw image imported when built
	@scripts/cluster.sh up
	@scripts/node.sh up

cluster-down: ## stop the node (its pods, mounts, network namespaces, bridge) and the control plane, by PID
	@scripts/node.sh down
	@scripts/cluster.sh down

tools: ## install helm, kubeconform (with offline Kubernetes schemas) and promtool into .cache/tools
	@scripts/tools.sh

.PHONY: image chart-check k8s-render

IMAGE ?= hl7gw:$(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
CONTAINER_ENGINE ?= $(shell for e in docker podman; do if command -v $$e >/dev/null 2>&1 && $$e info >/dev/null 2>&1; then echo $$e; break; fi; done)

image: ## build the container image (IMAGE=hl7gw:<version>) with docker or podman; CI machines have neither running
	@if [ -z "$(CONTAINER_ENGINE)" ]; then \
	  echo "make image: no running container engine (docker/podman) on this machine: image not built."; \
	  echo "  The Dockerfile runs the same 'cargo build --release --workspace --bins' as 'make build'."; \
	  echo "  On a machine with Docker: make image IMAGE=registry.example.org/hl7gw:0.1.0"; \
	  exit 1; \
	fi
	$(CONTAINER_ENGINE) build --build-arg VERSION=$(lastword $(subst :, ,$(IMAGE))) -t $(IMAGE) .

.PHONY: prom-check
prom-check: ## the chart's dashboard and alerts against a real Prometheus scraping a running pipeline: every panel answers under load, every rule inactive while healthy and pending/firing when provoked (~2.5 min; docs/observability.md)
	@scripts/prom-check.sh

chart-check: ## helm lint/template/kubeconform, values.schema.json refusals, committed renders, rules; then install/upgrade/test/uninstall on a local API server
	@scripts/chart-check.sh

k8s-render: ## regenerate the committed k8s/ renders and the chart's CRD from the chart and `hl7gw-transformer crd`, and the values table of the chart README
	@scripts/chart-check.sh render

.PHONY: k6-smoke bench-k6

k6-smoke: ## k6 (built once with our k6/x/mllp extension) drives a debug ingress over MLLP and gRPC for a few seconds; thresholds must pass
	@scripts/k6.sh smoke

bench-k6: ## k6 over MLLP and gRPC against a release ingress: 1/4/8 VUs and 8 VUs for K6_SECONDS (30) (docs/BENCHMARKS.md)
	@scripts/k6.sh bench

.PHONY: jaeger-up jaeger-down

jaeger-up: ## start Jaeger v2 on 127.0.0.1 (OTLP :4317/:4318, query API :16686; builds it once; docs/observability.md)
	@scripts/jaeger.sh up

jaeger-down: ## stop the local Jaeger
	@scripts/jaeger.sh down
