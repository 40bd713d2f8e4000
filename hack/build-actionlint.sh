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
# shellcheck source=hack/go-tool.sh
source "$(dirname "$0")/go-tool.sh"

ACTIONLINT_VERSION=${ACTIONLINT_VERSION:-v1.7.12}
# actionlint's go.mod has no replace directives (checked for v1.7.12). Built from a wrapper module, the
# binary cannot read its own version from the build info: set it.
build_go_tool actionlint github.com/rhysd/actionlint "$ACTIONLINT_VERSION" \
  github.com/rhysd/actionlint/cmd/actionlint 1.25 \
  -ldflags "-s -w -X github.com/rhysd/actionlint.version=$ACTIONLINT_VERSION"
