#!/usr/bin/env bash
# Build the container registry of the tests' real-node cluster (`registry` from CNCF Distribution,
# github.com/distribution/distribution/v3/cmd/registry) from the Go module proxy, once per version.
# Called by the tests (testcluster.binaries.ensure_registry); runnable alone too.
#
# The real node pulls the project's images from it as a real cluster pulls from its registry
# (tests/testcluster/registry.py). Distribution's go.mod has no replace directives (checked for v3.1.2).
# Built from a wrapper module, the binary cannot read its own version from the build info: set it.
#
# The binary lands in $KUBETRAIN_CACHE/k8s-bin/registry-<version>/ (a directory of its own, as Kueue's,
# so a new registry does not rebuild the control plane); a rerun with the same version is a no-op.
# Prints that directory as its last line.
set -euo pipefail
# shellcheck source=hack/go-tool.sh
source "$(dirname "$0")/go-tool.sh"

DISTRIBUTION_VERSION=${DISTRIBUTION_VERSION:-v3.1.2}
build_go_tool registry github.com/distribution/distribution/v3 "$DISTRIBUTION_VERSION" \
  github.com/distribution/distribution/v3/cmd/registry 1.26 \
  -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$DISTRIBUTION_VERSION"
