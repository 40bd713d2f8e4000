#!/usr/bin/env bash
# Build the operator and trainer images from Dockerfile.operator and Dockerfile.trainer, tagged
# ghcr.io/kubetrain/kubetrain-<name>:<pyproject.toml's version>.
#
# CONTAINER_ENGINE picks the builder. docker (what `make images` uses when a Docker engine answers):
# `docker build` of each Dockerfile, its base pulled from Docker Hub, docker's layer cache deciding what
# to rebuild. podman (the default, and what the tests push to the real node's registry:
# tests/testcluster/registry.py), below: this project's podman, once per content: an image is rebuilt only
# when the files it is built from change.
#
# No container registry is reachable from our machines, so the Dockerfiles' base image
# (python:3.11.14-slim-bookworm) cannot be pulled. A stand-in is made from Debian bookworm's own packages
# (mmdebstrap: python3.11, pip, CA certificates) and stored under the base image's name in this
# project's private podman storage; the Dockerfiles are used unchanged, as users build them.
# Prints the two image references as its last lines.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE_ROOT=${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}
mkdir -p "$CACHE_ROOT/images"
podman=hack/podman
version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
registry=ghcr.io/kubetrain
base_ref=docker.io/library/python:3.11.14-slim-bookworm

log() { printf '[build-images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

case ${CONTAINER_ENGINE:-podman} in
  podman) ;;
  docker)
    for name in operator trainer; do
      ref="$registry/kubetrain-$name:$version"
      log "$name: docker build $ref"
      # docker's progress goes to stderr, so the references stay this script's last lines.
      docker build -f "Dockerfile.$name" -t "$ref" . >&2
    done
    for name in operator trainer; do echo "$registry/kubetrain-$name:$version"; done
    exit 0
    ;;
  *) echo "CONTAINER_ENGINE=$CONTAINER_ENGINE: docker or podman" >&2; exit 2 ;;
esac

# The stand-in base: what it is made from is its cache key.
base_packages="python3,python3-pip,ca-certificates"
base_hook='rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED; ln -sf /usr/bin/python3 "$1"/usr/local/bin/python; ln -sf /usr/bin/pip3 "$1"/usr/local/bin/pip; rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/archives/*.deb'
base_key=$(printf '%s\n' bookworm minbase "$base_packages" "$base_hook" | sha256sum | cut -c1-16)
base_stamp="$CACHE_ROOT/images/base-$base_key"

build_base() {
  if [ -f "$base_stamp" ] && "$podman" image exists "$(cat "$base_stamp")"; then return; fi
  log "base: mmdebstrap bookworm minbase ($base_packages), about 2 minutes"
  local tarball="$CACHE_ROOT/images/base-$base_key.tar"
  # mmdebstrap picks the output format from the name: it must end in .tar.
  mmdebstrap --quiet --variant=minbase --include="$base_packages" --customize-hook="$base_hook" \
    bookworm "$tarball.partial.tar" http://deb.debian.org/debian
  mv "$tarball.partial.tar" "$tarball"
  "$podman" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
    "$tarball" "$base_ref" >"$base_stamp.tmp"
  mv "$base_stamp.tmp" "$base_stamp"
  rm -f "$tarball"
  log "base: $base_ref ($(cut -c1-19 "$base_stamp"))"
}

# What an image is built from: its Dockerfile, the build context that .dockerignore lets in, the base.
content_key() {
  {
    echo "$base_key"
    sha256sum "Dockerfile.$1" .dockerignore pyproject.toml
    find operator trainer -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' \
      -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
}

# Where TLS to the package index is intercepted, the machine trusts an extra CA that the image's pip does
# not know. Builds see the machine's CA bundle through a pip.conf mounted for the RUN steps only; nothing
# of it lands in an image.
build_mounts=()
ca_bundle=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
if [ -f "$ca_bundle" ]; then
  printf '[global]\ncert = /etc/kubetrain-build/ca.crt\n' >"$CACHE_ROOT/images/pip.conf"
  build_mounts=(--volume "$ca_bundle:/etc/kubetrain-build/ca.crt:ro" --volume "$CACHE_ROOT/images/pip.conf:/etc/pip.conf:ro")
fi

# Every build moves the tag and leaves the previous image untagged. Without this the cache grew by an
# image per code change (20 old trainer builds, 12 GB, were found in one cache) and was never reclaimed.
# Untagged images are removed, with the stamps that named this image's earlier builds.
forget_older_builds() {
  local name=$1 current=$2 stamp
  "$podman" image prune --force >/dev/null
  for stamp in "$CACHE_ROOT/images/$name"-*; do
    if [ "$stamp" != "$current" ]; then rm -f "$stamp"; fi
  done
}

build_image() {
  local name=$1 ref="$registry/kubetrain-$1:$version"
  local stamp; stamp="$CACHE_ROOT/images/$name-$(content_key "$name")"
  if [ -f "$stamp" ] && "$podman" image exists "$(cat "$stamp")"; then
    # The tag may point at a build of other content (another checkout's); this content's image gets it back.
    "$podman" tag "$(cat "$stamp")" "$ref"
    log "$name: $ref up to date"
  else
    log "$name: building $ref"
    local start; start=$(date +%s)
    # --network=host: only pip's downloads from the package index go out, as they would on the host.
    "$podman" build --quiet --pull=never --network=host --layers "${build_mounts[@]}" -f "Dockerfile.$name" -t "$ref" . >"$stamp.tmp" || { rm -f "$stamp.tmp"; exit 1; }
    mv "$stamp.tmp" "$stamp"
    log "$name: built in $(( $(date +%s) - start ))s"
    forget_older_builds "$name" "$stamp"
  fi
  echo "$ref"
}

build_base
build_image operator
build_image trainer
