#!/usr/bin/env bash
# Build actionlint (the GitHub Actions workflow checker; tests/release/test_workflows.py runs it on
# .github/workflows/) from the Go module proxy, once per version. Called by the tests
# (testcluster.binaries.ensure_actionlint); runnable alone too.
#
# The binary lands in $KUBETRAIN_CACHE/k8s-bin/actionlint-<version>/ (a directory of its own, as Kueue's,
# so a new actionlint does not rebuild the control plane); a rerun with the same version is a no-op.
# Cold (empty Go caches) it took 15 s on 2 cores: a dozen small dependencies.
# Prints that directory as its last line.
set -euo pipefail

ACTIONLINT_VERSION=${ACTIONLINT_VERSION:-v1.7.12}
CACHE_ROOT=${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}
out="$CACHE_ROOT/k8s-bin/actionlint-${ACTIONLINT_VERSION}"
mkdir -p "$out"

log() { printf '[build-actionlint %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# One build at a time per version: test sessions started together wait for the first one's binary.
exec 9>"$out/.lock"
flock 9

if [ ! -x "$out/actionlint" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
  # actionlint's go.mod has no replace directives (checked for v1.7.12), so a wrapper module that only
  # requires it resolves the same dependency versions as its own release build.
  printf 'module kubetrain.local/actionlintbuild\n\ngo 1.25\n\nrequire github.com/rhysd/actionlint %s\n' \
    "$ACTIONLINT_VERSION" >"$work/go.mod"
  log "actionlint $ACTIONLINT_VERSION: building"
  start=$(date +%s)
  # Built from a wrapper module, the binary cannot read its own version from the build info: set it.
  (cd "$work" && go build -trimpath -ldflags "-s -w -X github.com/rhysd/actionlint.version=$ACTIONLINT_VERSION" \
    -o "$out/actionlint.tmp" github.com/rhysd/actionlint/cmd/actionlint && mv "$out/actionlint.tmp" "$out/actionlint")
  log "actionlint: built in $(( $(date +%s) - start ))s"
fi
echo "$out"
