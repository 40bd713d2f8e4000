#!/usr/bin/env bash
# Build the Kubernetes test cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, kwok, helm, and for the real node kubelet, kube-proxy and CoreDNS) from upstream Go modules,
# once per version set. Kueue is not part of the set: only the Kueue tests run it, so hack/build-kueue.sh
# builds it on their first use (or in `make test`'s background builds) into a directory of its own.
#
# Only the Go module proxy is reachable from our machines, so release binaries cannot be downloaded.
# Binaries land in $KUBETRAIN_CACHE/k8s-bin/<versions>/ and a rerun with the same versions is a no-op.
# Prints the directory holding the binaries as its last line.
#
# `hack/build-k8s.sh --control-plane-only VERSION` builds only kube-apiserver, kube-controller-manager and
# kube-scheduler of another Kubernetes version (the oldest the chart supports, which the suite also runs
# against beside the current set's etcd, kwok, kubectl and helm), under $KUBETRAIN_CACHE/k8s-bin/
# control-plane-VERSION/.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.7}
CACHE_ROOT=${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}
control_plane_only=0
if [ "${1:-}" = "--control-plane-only" ]; then
  [ -n "${2:-}" ] || { echo "usage: $0 --control-plane-only VERSION (e.g. v1.32.9)" >&2; exit 2; }
  control_plane_only=1
  K8S_VERSION=$2
  key="control-plane-${K8S_VERSION}"
else
  key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_coredns-${COREDNS_VERSION}"
fi
out="$CACHE_ROOT/k8s-bin/$key"
mkdir -p "$out"
# One build at a time per version set: a second caller (a test session started while `make binaries`
# runs) waits here and then finds the binaries present, instead of building into the same .tmp files.
exec 9>"$out.lock"
flock 9

log() { printf '[build-k8s %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
have() { [ -x "$out/$1" ]; }

K8S_BINARIES="kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy"
[ "$control_plane_only" = 1 ] && K8S_BINARIES="kube-apiserver kube-controller-manager kube-scheduler"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0

build_etcd() {
  have etcd && return
  log "etcd $ETCD_VERSION: building (wrapper module, etcd's own replace directives do not apply to dependents)"
  local dir="$work/etcd"; mkdir -p "$dir"
  cat >"$dir/go.mod" <<MOD
module kubetrain.local/etcdbuild

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
MOD
  (cd "$dir" && go build -trimpath -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3 && mv "$out/etcd.tmp" "$out/etcd")
  log "etcd: done"
}

build_kubernetes() {
  local missing=0 b
  for b in $K8S_BINARIES; do have "$b" || missing=1; done
  [ "$missing" = 1 ] || return 0
  log "kubernetes $K8S_VERSION: resolving staging modules from its go.mod"
  local dir="$work/k8s"; mkdir -p "$dir"
  local gomod
  gomod=$(cd "$dir" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  local staging_version="v0.${K8S_VERSION#v1.}"
  {
    echo "module kubetrain.local/k8sbuild"; echo; echo "go 1.25"; echo
    echo "require k8s.io/kubernetes $K8S_VERSION"; echo
    # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with local paths;
    # a dependent must pin each one to the matching published version instead.
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } >"$dir/go.mod"
  log "kubernetes: $(grep -c '^replace' "$dir/go.mod") staging modules pinned to $staging_version"
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for b in $K8S_BINARIES; do
    have "$b" && continue
    log "kubernetes: building $b (cold: several minutes each on 2 cores)"
    # The module proxy now and then refuses one download (403 "not available") and serves it on the next
    # try; a cold build fetches hundreds, so it tries three times before giving up.
    local try
    for try in 1 2 3; do
      (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b") && break
      [ "$try" = 3 ] && return 1
      log "kubernetes: $b failed (try $try of 3); trying again in 10 s"; sleep 10
    done
    mv "$out/$b.tmp" "$out/$b"
    log "kubernetes: $b done"
  done
}

build_simple() {  # name module-main-package module version
  local name=$1 pkg=$2 mod=$3 version=$4
  have "$name" && return
  log "$name $version: building"
  local dir="$work/$name"; mkdir -p "$dir"
  printf 'module kubetrain.local/%sbuild\n\ngo 1.25\n\nrequire %s %s\n' "$name" "$mod" "$version" >"$dir/go.mod"
  local ldflags="-s -w"
  [ "$name" = helm ] && ldflags+=" -X helm.sh/helm/v3/internal/version.version=$version"
  [ "$name" = kwok ] && ldflags+=" -X sigs.k8s.io/kwok/pkg/consts.Version=$version"
  (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg" && mv "$out/$name.tmp" "$out/$name")
  log "$name: done"
}

# CoreDNS with only the plugins the real node's Corefile uses (tests/testcluster/node.py): a main of our
# own that imports them, as CoreDNS documents for custom builds. Its stock main imports every plugin,
# whose cloud providers' SDKs (Route 53, Azure DNS, Cloud DNS) and others were most of the build.
COREDNS_PLUGINS="bind cache errors kubernetes template"
build_coredns() {
  have coredns && return
  log "coredns $COREDNS_VERSION: building with the plugins $COREDNS_PLUGINS"
  local dir="$work/coredns"; mkdir -p "$dir"
  printf 'module kubetrain.local/corednsbuild\n\ngo 1.25\n\nrequire github.com/coredns/coredns %s\n' \
    "$COREDNS_VERSION" >"$dir/go.mod"
  {
    echo "package main"; echo; echo "import ("
    local plugin
    for plugin in $COREDNS_PLUGINS; do echo "	_ \"github.com/coredns/coredns/plugin/$plugin\""; done
    echo "	\"github.com/coredns/coredns/coremain\""; echo ")"; echo
    echo "func main() { coremain.Run() }"
  } >"$dir/main.go"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$out/coredns.tmp" . && mv "$out/coredns.tmp" "$out/coredns")
  log "coredns: done"
}

start=$(date +%s)
if [ "$control_plane_only" = 1 ]; then
  build_kubernetes
  log "control plane $K8S_VERSION present in $(( $(date +%s) - start ))s"
  echo "$out"
  exit 0
fi
build_etcd
build_simple kwok sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok "$KWOK_VERSION"
build_simple helm helm.sh/helm/v3/cmd/helm helm.sh/helm/v3 "$HELM_VERSION"
build_kubernetes
build_coredns
log "all binaries present in $(( $(date +%s) - start ))s"
echo "$out"
