# Sourced by hack/build-actionlint.sh, hack/build-promtool.sh and hack/build-registry.sh: build one Go
# command from the Go module proxy into a cache directory of its own, once per version.
#
#   build_go_tool NAME MODULE VERSION PACKAGE GO_VERSION [go build flags...]
#
# The binary lands in $KUBETRAIN_CACHE/k8s-bin/NAME-VERSION/NAME (a directory of its own, as Kueue's, so
# a new tool does not rebuild the control plane); a rerun with the same version is a no-op. One build at a
# time per version: test sessions started together wait for the first one's binary. The module is
# required by a wrapper module, which resolves the same dependency versions as the tool's own release
# build as long as its go.mod has no replace directives (each caller says it checked). Prints the
# directory as its last line.

build_go_tool() {
  local name=$1 module=$2 version=$3 package=$4 go_version=$5
  shift 5
  local cache_root=${KUBETRAIN_CACHE:-$HOME/.cache/kubetrain}
  local out="$cache_root/k8s-bin/$name-$version"
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9
  if [ ! -x "$out/$name" ]; then
    local work start
    work=$(mktemp -d)
    # shellcheck disable=SC2064  # the directory is known now; expand it now
    trap "rm -rf '$work'" EXIT
    printf 'module kubetrain.local/%sbuild\n\ngo %s\n\nrequire %s %s\n' "$name" "$go_version" "$module" "$version" \
      >"$work/go.mod"
    printf '[build-%s %s] %s\n' "$name" "$(date +%H:%M:%S)" "$name $version: building" >&2
    start=$(date +%s)
    (cd "$work" && GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 go build -trimpath "$@" \
      -o "$out/$name.tmp" "$package" && mv "$out/$name.tmp" "$out/$name")
    printf '[build-%s %s] %s\n' "$name" "$(date +%H:%M:%S)" "built in $(( $(date +%s) - start ))s" >&2
  fi
  echo "$out"
}
