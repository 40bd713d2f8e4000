#!/usr/bin/env bash
# Build the peer controllers the operator is measured against (benchmarks/peers.py), once per version.
#
# JobSet (sigs.k8s.io/jobset) is built from its Go module: the manager is the module root's main.go,
# the module has no replace directives, so a wrapper module that requires it resolves the same
# dependency versions JobSet's own go.mod pins. Its CRD is copied from the module zip at build time;
# it is never committed here. The proxy refuses the version list for this module, so the default
# is the newest release it serves (JOBSET_VERSION overrides).
#
# Output: $KUBETRAIN_CACHE/peers/jobset-<version>/{jobset-manager,crd/} ; prints that directory last.
set -euo pipefail

JOBSET_VERSION=${JOBSET_VERSION:-v0.12.0}
CACHE_ROOT=${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}
out="$CACHE_ROOT/peers/jobset-$JOBSET_VERSION"
mkdir -p "$out"

log() { printf '[build-peers %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0

if [ ! -x "$out/jobset-manager" ] || [ ! -s "$out/crd/jobset.x-k8s.io_jobsets.yaml" ]; then
  start=$(date +%s)
  log "jobset $JOBSET_VERSION: building the manager (cold: several minutes on 2 cores)"
  printf 'module kubetrain.local/jobsetbuild\n\ngo 1.26\n\nrequire sigs.k8s.io/jobset %s\n' "$JOBSET_VERSION" >"$work/go.mod"
  (cd "$work" && go build -trimpath -ldflags "-s -w" -o "$out/jobset-manager.tmp" sigs.k8s.io/jobset \
    && mv "$out/jobset-manager.tmp" "$out/jobset-manager")
  src=$(cd "$work" && go list -m -f '{{.Dir}}' sigs.k8s.io/jobset)
  mkdir -p "$out/crd"
  cp "$src"/config/components/crd/bases/*.yaml "$out/crd/"
  chmod -R u+w "$out/crd"
  log "jobset: done in $(( $(date +%s) - start ))s"
fi
echo "$out"
