#!/usr/bin/env bash
# Build the hbmcoll images (what `make docker` runs).
#
#   docker/build.sh [runtime] [torch] [dev]      default: all three
#
#   hbmcoll:latest   runtime: hbmcoll + NumPy                                  (target runtime)
#   hbmcoll:torch    runtime + torch CPU                                       (target torch)
#   hbmcoll:dev      torch + MPICH, mpi4py, pytest, compilers, the checkout    (target dev)
#
# Environment: HBMCOLL_IMAGE (image name, default hbmcoll), HBMCOLL_ENGINE (engine command, see
# docker/engine.sh), TORCH_VERSION (2.13.0), TORCH_INDEX_URL (an index with CPU wheels, if
# reachable), BUILD_ARGS (more flags for `ENGINE build`, e.g. "--no-cache").
#
# Steps: install podman/runc/debootstrap if missing (no Docker daemon), build debian:bookworm-slim
# with debootstrap unless it is stored already (docker/build-base.sh), put the host's CPU torch
# wheel into docker/wheels/ (pip download torch==VERSION+cpu: found where the host's pip finds it,
# e.g. a find-links directory; PyPI has only the CUDA build), copy the host's CA bundle to
# docker/ca/build-ca.crt for pip in the build stages (HBMCOLL_BUILD_CA, else $PIP_CERT, else
# $SSL_CERT_FILE, else /etc/ssl/certs/ca-certificates.crt), then `ENGINE build` per image.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=docker/engine.sh
. docker/engine.sh
engine_install

IMAGE=${HBMCOLL_IMAGE:-hbmcoll}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
read -r -a EXTRA <<<"${BUILD_ARGS:-}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(runtime torch dev)

docker/build-base.sh --engine "${ENGINE[*]}"

# pip in the build stages trusts the host's CA bundle (sites whose HTTPS proxy re-signs PyPI)
ca=${HBMCOLL_BUILD_CA:-${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
mkdir -p docker/ca
if [ -s "$ca" ] && ! cmp -s "$ca" docker/ca/build-ca.crt; then cp "$ca" docker/ca/build-ca.crt; fi

need_torch=0
for t in "${targets[@]}"; do
  case "$t" in
    runtime) ;;
    torch|dev) need_torch=1 ;;
    *) echo "build.sh: unknown image '$t' (runtime, torch, dev)" >&2; exit 2 ;;
  esac
done

if [ "$need_torch" = 1 ]; then
  mkdir -p docker/wheels
  whls=(docker/wheels/torch-"$TORCH_VERSION"[+-]*.whl)
  if [ -e "${whls[0]}" ]; then
    echo "torch wheel: ${whls[0]}"
  else
    # A CPU build for the image's Python (3.11, manylinux x86_64), wherever this host's pip finds
    # one; with TORCH_INDEX_URL also from that index. Nothing is installed on the host.
    extra=()
    [ -n "${TORCH_INDEX_URL:-}" ] && extra=(--extra-index-url "$TORCH_INDEX_URL")
    if python3 -m pip download -q --no-deps --only-binary=:all: --implementation cp \
         --python-version 3.11 --platform manylinux_2_28_x86_64 "${extra[@]}" \
         -d docker/wheels "torch==$TORCH_VERSION+cpu" 2>/tmp/hbmcoll-torch-download.log; then
      echo "torch wheel: $(cd docker/wheels && echo torch-"$TORCH_VERSION"+cpu-*.whl) (from the host's pip sources)"
    else
      echo "torch wheel: no torch==$TORCH_VERSION+cpu wheel reachable from this host's pip;" \
           "the torch image installs torch==$TORCH_VERSION from ${TORCH_INDEX_URL:-PyPI (the CUDA build, > 1.9 GB)}"
    fi
  fi
fi

mkdir -p build
tag_of() {
  case "$1" in runtime) echo "$IMAGE:latest" ;; *) echo "$IMAGE:$1" ;; esac
}

for t in "${targets[@]}"; do
  tag=$(tag_of "$t")
  t0=$(date +%s)
  echo "== ${ENGINE[*]} build --target $t -t $tag"
  "${ENGINE[@]}" build "${BUILD_FLAGS[@]}" "${EXTRA[@]}" -f docker/Dockerfile --target "$t" \
    --build-arg TORCH_VERSION="$TORCH_VERSION" --build-arg TORCH_INDEX_URL="${TORCH_INDEX_URL:-}" \
    -t "$tag" . >"build/docker-build-$t.log" 2>&1 || {
      echo "build.sh: building $tag failed; the end of build/docker-build-$t.log:" >&2
      tail -30 "build/docker-build-$t.log" >&2
      exit 1
    }
  size=$("${ENGINE[@]}" image inspect --format '{{.Size}}' "$tag")
  echo "   $tag: $(( $(date +%s) - t0 )) s, $(( size / 1000000 )) MB (log: build/docker-build-$t.log)"
done
