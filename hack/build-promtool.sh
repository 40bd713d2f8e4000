#!/usr/bin/env bash
# Build promtool (Prometheus' rule checker; tests/chart/test_chart_monitoring.py runs `promtool check
# rules` and `promtool test rules` on the chart's PrometheusRule) from the Go module proxy, once per
# version. Called by the tests (testcluster.binaries.ensure_promtool); runnable alone too.
#
# Prometheus publishes its Go module as v0.3<minor>.<patch> for the release 3.<minor>.<patch>: v0.316.0
# is Prometheus 3.16.0 (`go list -m -versions github.com/prometheus/prometheus` lists them). Built with the tag remove_all_sd: the
# service-discovery plugins (AWS, Azure, GCE, Kubernetes... SDKs, most of a full build) are left out,
# which only `promtool check config` of such configs would miss; rules and their unit tests need none.
# Cold (empty Go module and build caches) it took 260 s on 2 cores under load, downloads included (2m25s
# of CPU); with the modules the control plane's build already fetched, 165 s.
#
# The binary lands in $KUBETRAIN_CACHE/k8s-bin/promtool-<version>/ (a directory of its own, as Kueue's,
# so a new promtool does not rebuild the control plane); a rerun with the same version is a no-op.
# Prints that directory as its last line.
set -euo pipefail

PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}
CACHE_ROOT=${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}
out="$CACHE_ROOT/k8s-bin/promtool-${PROMETHEUS_VERSION}"
mkdir -p "$out"

log() { printf '[build-promtool %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# One build at a time per version: test sessions started together wait for the first one's binary.
exec 9>"$out/.lock"
flock 9

if [ ! -x "$out/promtool" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  export GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0
  # Prometheus' go.mod has no replace directives (checked for v0.316.0), so a wrapper module that only
  # requires it resolves the same dependency versions as its own release build.
  printf 'module kubetrain.local/promtoolbuild\n\ngo 1.26\n\nrequire github.com/prometheus/prometheus %s\n' \
    "$PROMETHEUS_VERSION" >"$work/go.mod"
  minor_patch=${PROMETHEUS_VERSION#v0.3}
  release="3.$((10#${minor_patch%%.*})).${minor_patch#*.}"
  log "promtool $PROMETHEUS_VERSION (Prometheus $release): building"
  start=$(date +%s)
  # Built from a wrapper module, the binary cannot read its own version from the build info: set it.
  (cd "$work" && go build -trimpath -tags remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
    -o "$out/promtool.tmp" github.com/prometheus/prometheus/cmd/promtool && mv "$out/promtool.tmp" "$out/promtool")
  log "promtool: built in $(( $(date +%s) - start ))s"
fi
echo "$out"
