#!/usr/bin/env bash
# Debian packages the image builds and the real test node need; installs only what is missing, so a
# machine that has them all runs no apt at all. Needs root (CI and these machines run as root).
set -euo pipefail
packages=(
  podman buildah crun mmdebstrap uidmap   # image builds (hack/build-images.sh, hack/podman)
  containerd runc containernetworking-plugins iptables conntrack socat iproute2   # the real node
)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "[system-packages] installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
