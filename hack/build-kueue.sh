#!/usr/bin/env bash
# Build Kueue's manager (sigs.k8s.io/kueue/cmd/kueue) from the Go module proxy and copy its CRDs and
# webhook configurations out of the module zip, once per Kueue version. Called by the tests on first use
# (testcluster.binaries.ensure_kueue) and by `make test`'s background builds; runnable alone too.
#
# Binary, CRDs (crds/) and webhook configurations (webhooks.yaml) land in $KUBETRAIN_CACHE/k8s-bin/kueue-<version>/ (a directory of their own, so a new
# Kueue version does not rebuild the control plane); a rerun with the same version is a no-op.
# Prints that directory as its last line.
set -euo pipefail

KUEUE_VERSION=${KUEUE_VERSION:-v0.19.2}
CACHE_ROOT=${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}
out="$CACHE_ROOT/k8s-bin/kueue-${KUEUE_VERSION}"
mkdir -p "$out"

log() { printf '[build-kueue %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# One build at a time per version: test sessions started together wait for the first one's binary.
exec 9>"$out/.lock"
flock 9

if [ ! -x "$out/kueue" ] || [ ! -d "$out/crds" ] || [ ! -f "$out/webhooks.yaml" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
  # Kueue's go.mod has no replace directives (checked for v0.19.x), so a wrapper module that only
  # requires it resolves the same dependency versions as Kueue's own build.
  printf 'module kubetrain.local/kueuebuild\n\ngo 1.26\n\nrequire sigs.k8s.io/kueue %s\n' "$KUEUE_VERSION" >"$work/go.mod"
  moddir=$(cd "$work" && GOFLAGS= go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  if [ ! -d "$out/crds" ]; then
    # The CRDs Kueue's release installs; the module zip carries them, release downloads are unreachable.
    mkdir -p "$out/crds.tmp"
    cp "$moddir"/config/components/crd/bases/*.yaml "$out/crds.tmp/"
    chmod -R u+w "$out/crds.tmp"
    mv "$out/crds.tmp" "$out/crds"
  fi
  if [ ! -f "$out/webhooks.yaml" ]; then
    # What Kueue's release registers (before kustomize points it at its Service); the test harness
    # points each webhook at the manager's address instead.
    cp "$moddir/config/components/webhook/manifests.yaml" "$out/webhooks.yaml.tmp"
    chmod u+w "$out/webhooks.yaml.tmp"
    mv "$out/webhooks.yaml.tmp" "$out/webhooks.yaml"
  fi
  if [ ! -x "$out/kueue" ]; then
    log "kueue $KUEUE_VERSION: building the manager (cold: many minutes on 2 cores)"
    (cd "$work" && go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
      -o "$out/kueue.tmp" sigs.k8s.io/kueue/cmd/kueue && mv "$out/kueue.tmp" "$out/kueue")
    log "kueue: done"
  fi
fi
echo "$out"
