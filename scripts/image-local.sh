#!/usr/bin/env bash
# The hl7gw image built without a Docker daemon or a registry, for machines (and the local node) that have
# neither: the release binaries of `make build` and exactly the shared libraries `ldd` lists for them, on an
# empty base, packed as an OCI image by umoci (Debian's package, via scripts/tools.sh). Same binaries, user
# 65532, entrypoint, ports and labels as the Dockerfile, which stays the way to build it with Docker.
#
#   scripts/image-local.sh [build]   cargo build --release --workspace --bins, then the image:
#                                    .cache/image/oci (OCI layout, ref <version>) and
#                                    .cache/image/hl7gw-<version>.oci.tar (for `ctr -n k8s.io images import`)
#   scripts/image-local.sh check     the built image against the Dockerfile (binaries, USER, ENTRYPOINT, EXPOSE)
#                                    and every binary's --version run inside the image's root filesystem as
#                                    user 65532 (chroot: needs root), which proves no library is missing
#
# IMAGE_PROFILE=debug packs target/debug's binaries instead (their debug info stripped: 5 x 290 MB otherwise),
# built by `cargo build --workspace --all-targets`: what the local node test uses after `cargo test` built
# them, so it needs no release build. The release image is the one to ship and the one `check` compares.
#
# What the distroless base has and this image does not: tzdata (the services log and stamp in UTC) and a
# libssl (librdkafka's OpenSSL is linked in statically).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)
out=$root/.cache/image
layout=$out/oci
bundle=$out/bundle
tarball=$out/hl7gw-$version.oci.tar
bins=(hl7gw hl7gw-ingress hl7gw-transformer hl7gw-egress hl7gw-load)
profile=${IMAGE_PROFILE:-release}
case $profile in release | debug) ;; *) echo "image-local: IMAGE_PROFILE is release or debug" >&2; exit 2 ;; esac

log() { printf 'image-local: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# The binaries the Dockerfile copies into the image, in its order.
dockerfile_bins() {
  grep -o 'target/release/[a-z0-9-]*' "$root/Dockerfile" | sed 's|target/release/||' | sort -u
}

build() {
  [ "$(printf '%s\n' "${bins[@]}" | sort -u)" = "$(dockerfile_bins)" ] ||
    die "the Dockerfile copies $(dockerfile_bins | tr '\n' ' ')but this script packs ${bins[*]}"
  local umoci t0=$SECONDS
  umoci=$("$root/scripts/tools.sh" umoci)
  if [ "$profile" = release ]; then
    log "cargo build --release --workspace --bins (as make build)"
    (cd "$root" && cargo build --release --workspace --bins)
  else
    # --all-targets: the same features as `cargo test --workspace --all-targets`, so neither rebuilds the other's.
    log "cargo build --workspace --all-targets (IMAGE_PROFILE=debug)"
    (cd "$root" && cargo build --workspace --all-targets)
  fi
  rm -rf "$out"
  mkdir -p "$out"
  local rootfs=$out/rootfs
  mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp"
  chmod 1777 "$rootfs/tmp"
  local b lib
  for b in "${bins[@]}"; do
    if [ "$profile" = release ]; then
      install -m 0755 "$root/target/release/$b" "$rootfs/usr/local/bin/$b"
    else
      objcopy --strip-debug "$root/target/debug/$b" "$rootfs/usr/local/bin/$b"
      chmod 0755 "$rootfs/usr/local/bin/$b"
    fi
  done
  # Exactly what the dynamic loader will look for: every library ldd resolves, and the loader itself.
  for lib in $(ldd "${bins[@]/#/$root/target/$profile/}" | awk '/=>/ {print $3} /^\t\/.*ld-linux/ {print $1}' | sort -u); do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done
  # As distroless: CA certificates, root and nonroot (65532) users.
  cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
  mkdir -p "$rootfs/home/nonroot"
  chown 65532:65532 "$rootfs/home/nonroot"

  "$umoci" init --layout "$layout"
  "$umoci" new --image "$layout:$version"
  "$umoci" unpack --image "$layout:$version" "$bundle" >/dev/null
  cp -a "$rootfs/." "$bundle/rootfs/"
  "$umoci" repack --image "$layout:$version" "$bundle"
  "$umoci" config --image "$layout:$version" \
    --author hl7gw --os linux --architecture amd64 \
    --config.user 65532:65532 \
    --config.entrypoint /usr/local/bin/hl7gw-ingress \
    --config.env PATH=/usr/local/bin:/usr/bin:/bin \
    --config.exposedports 2575/tcp --config.exposedports 50051/tcp --config.exposedports 9464/tcp \
    --config.label org.opencontainers.image.title=hl7gw \
    --config.label "org.opencontainers.image.description=Kubernetes-native HL7 v2 gateway: MLLP/gRPC ingress, transformer, egress" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label org.opencontainers.image.licenses=Apache-2.0
  "$umoci" gc --layout "$layout"
  rm -rf "$rootfs"
  tar -C "$layout" -cf "$tarball" .
  log "built $tarball ($profile binaries, $(du -h "$tarball" | cut -f1)) in $((SECONDS - t0)) s"
}

check() {
  [ "$profile" = release ] || die "check compares the release image (IMAGE_PROFILE=release)"
  [ -f "$layout/index.json" ] || die "no image: run scripts/image-local.sh first"
  python3 - "$layout" "$version" "$root/Dockerfile" <<'EOF'
import json, os, re, sys
layout, version, dockerfile = sys.argv[1:]
blob = lambda d: json.load(open(os.path.join(layout, "blobs", *d.split(":"))))
index = json.load(open(os.path.join(layout, "index.json")))
ref = [m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == version]
assert len(ref) == 1, "one manifest tagged %s: %s" % (version, index)
config = blob(blob(ref[0]["digest"])["config"]["digest"])["config"]
text = open(dockerfile).read()
user = re.search(r"^USER (\S+)", text, re.M).group(1)
entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])", text, re.M).group(1))
ports = sorted("%s/tcp" % p for p in re.search(r"^EXPOSE (.*)$", text, re.M).group(1).split())
problems = []
if config.get("User") != user:
    problems.append("user %r, the Dockerfile says %r" % (config.get("User"), user))
if config.get("Entrypoint") != entrypoint:
    problems.append("entrypoint %r, the Dockerfile says %r" % (config.get("Entrypoint"), entrypoint))
if sorted(config.get("ExposedPorts", {})) != ports:
    problems.append("ports %r, the Dockerfile says %r" % (sorted(config.get("ExposedPorts", {})), ports))
if problems:
    sys.exit("image-local: the image differs from the Dockerfile: " + "; ".join(problems))
print("image-local: user %s, entrypoint %s, ports %s: as the Dockerfile" % (user, entrypoint[0], " ".join(ports)))
EOF
  local b rootfs=$bundle/rootfs
  for b in $(dockerfile_bins); do
    [ -x "$rootfs/usr/local/bin/$b" ] || die "$b is not in the image"
    cmp -s "$rootfs/usr/local/bin/$b" "$root/target/release/$b" || die "$b in the image is not target/release/$b"
    chroot --userspec=65532:65532 "$rootfs" "/usr/local/bin/$b" --version >/dev/null ||
      die "$b --version fails inside the image (a missing library?)"
  done
  log "every binary of the Dockerfile is in the image, equal to target/release, and runs there as 65532"
}

case "${1:-build}" in
  build) build ;;
  check) check ;;
  *) echo "usage: $0 [build]|check" >&2; exit 2 ;;
esac
