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
# shellcheck source=hack/go-tool.sh
source "$(dirname "$0")/go-tool.sh"

PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}
minor_patch=${PROMETHEUS_VERSION#v0.3}
release="3.$((10#${minor_patch%%.*})).${minor_patch#*.}"
# Prometheus' go.mod has no replace directives (checked for v0.316.0). Built from a wrapper module, the
# binary cannot read its own version from the build info: set it.
build_go_tool promtool github.com/prometheus/prometheus "$PROMETHEUS_VERSION" \
  github.com/prometheus/prometheus/cmd/promtool 1.26 -tags remove_all_sd \
  -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release"
