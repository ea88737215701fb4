# syntax=docker/dockerfile:1.7
# hl7gw: one image with every binary (hl7gw-ingress, hl7gw-transformer, hl7gw-egress, hl7gw, hl7gw-load).
#
#   make image                      # docker or podman, whichever runs here; IMAGE=hl7gw:0.1.0 by default
#   docker build -t hl7gw:dev .     # the same by hand
#
# Stage 1 builds with the exact command `make build` runs (cargo build --release --workspace --bins), on the
# Rust version rust-toolchain.toml pins, on Debian 12 (bookworm). librdkafka is compiled from source by the
# rdkafka crate (needs a C toolchain, make and perl: all in the rust:*-bookworm image); protobufs are compiled by
# protox in build.rs, so no protoc is needed.
# Stage 2 is distroless/cc (glibc, libgcc, CA certificates, tzdata; no shell, no package manager), user 65532.
# The binaries need libz.so.1 besides glibc/libgcc (librdkafka links zlib); it is copied from the builder so the
# image does not depend on whether a given distroless release ships it. Nothing in the image runs a shell:
# the chart's preStop hook is a `sleep` lifecycle action, and its probes are gRPC/HTTP.

ARG RUST_VERSION=1.95.0
ARG DEBIAN_RELEASE=bookworm

FROM docker.io/library/rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
# Only what the build reads (.dockerignore keeps target/, .cache/ and .git out of the context).
COPY Cargo.toml Cargo.lock rust-toolchain.toml clippy.toml ./
COPY proto proto
COPY services services
COPY loadtest loadtest
# Cache mounts keep the registry and target dir between builds on the same machine (BuildKit); the binaries are
# copied out of the cache mount in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --workspace --bins \
 && mkdir -p /out/bin \
 && cp target/release/hl7gw target/release/hl7gw-ingress target/release/hl7gw-transformer \
       target/release/hl7gw-egress target/release/hl7gw-load /out/bin/ \
 && /out/bin/hl7gw-ingress --version && /out/bin/hl7gw-load --version
# The shared libraries the binaries need beyond what distroless/cc has (glibc, libgcc_s, libm): libz.so.1.
# Fails the build when a new dependency appears, so the runtime stage can never miss a library.
RUN set -eu; arch="$(gcc -print-multiarch)"; mkdir -p "/out/lib/$arch"; \
    cp -L "/lib/$arch/libz.so.1" "/out/lib/$arch/"; \
    extra="$(ldd /out/bin/* | awk '/=>/ {print $1}' | sort -u | grep -vE '^(linux-vdso|libc|libm|libgcc_s|libz|libdl|libpthread|librt|ld-linux)' || true)"; \
    if [ -n "$extra" ]; then echo "unexpected shared libraries: $extra" >&2; exit 1; fi

FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="hl7gw" \
      org.opencontainers.image.description="Kubernetes-native HL7 v2 gateway: MLLP/gRPC ingress, transformer, egress" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/lib/ /usr/lib/
COPY --from=build /out/bin/ /usr/local/bin/
# distroless's `nonroot` user; numeric so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
# MLLP, gRPC, admin HTTP (/healthz, /readyz, /metrics)
EXPOSE 2575 50051 9464
# The chart picks the binary per Deployment (command:); the default runs the ingress.
ENTRYPOINT ["/usr/local/bin/hl7gw-ingress"]
