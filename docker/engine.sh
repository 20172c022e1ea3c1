#!/usr/bin/env bash
# Which container engine to use, and the flags it needs on this machine.
#
#   docker/engine.sh engine        the engine command: "docker" when a Docker daemon answers
#                                  (`docker info` succeeds), else "podman --runtime runc" (runc:
#                                  crun refuses some cgroup v1 layouts), else "podman"
#   docker/engine.sh build-flags   flags for `ENGINE build`
#   docker/engine.sh run-flags     flags for `ENGINE run`
#   docker/engine.sh install       install podman, runc and debootstrap with apt-get when there is
#                                  no Docker daemon and they are missing
#
# HBMCOLL_ENGINE overrides the engine command, e.g. HBMCOLL_ENGINE="podman" or "docker".
# Sourcing this file defines the same as shell variables: ENGINE (array), ENGINE_KIND
# (docker|podman), BUILD_FLAGS and RUN_FLAGS (arrays); it leaves the caller's shell options alone.

engine_detect() {
  if [ -n "${HBMCOLL_ENGINE:-}" ]; then
    echo "$HBMCOLL_ENGINE"
  elif command -v docker >/dev/null 2>&1 && timeout 20 docker info >/dev/null 2>&1; then
    echo docker
  elif command -v podman >/dev/null 2>&1 && ! command -v runc >/dev/null 2>&1; then
    echo podman
  else
    echo "podman --runtime runc"   # (what `engine.sh install` sets up when nothing is there)
  fi
}

engine_install() {
  local p pkgs=(debootstrap) missing=()
  case "$(engine_detect)" in
    docker*) ;;
    *) pkgs+=(podman runc) ;;
  esac
  for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "engine.sh: ${missing[*]} missing; apt-get install ${missing[*]} (as root)" >&2
    return 1
  fi
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

read -r -a ENGINE <<<"$(engine_detect)"
case "${ENGINE[0]}" in
  docker) ENGINE_KIND=docker ;;
  *) ENGINE_KIND=podman ;;
esac
if [ "$ENGINE_KIND" = podman ]; then
  # --pull=never: FROM is the local debian:bookworm-slim (build-base.sh) and no registry is asked.
  # --network host: the RUN steps reach apt and PyPI without a configured container network.
  BUILD_FLAGS=(--pull=never --network host --ignorefile docker/Dockerfile.dockerignore)
  # The limits podman would raise by default cannot be raised here; ask for what there is.
  RUN_FLAGS=(--ulimit nofile=1024:1024 --ulimit nproc=4096:4096)
else
  # Docker (BuildKit) reads docker/Dockerfile.dockerignore beside the Dockerfile by itself.
  BUILD_FLAGS=(--network host)
  RUN_FLAGS=()
fi

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-engine}" in
    engine) echo "${ENGINE[*]}" ;;
    build-flags) echo "${BUILD_FLAGS[*]}" ;;
    run-flags) echo "${RUN_FLAGS[*]}" ;;
    install) engine_install ;;
    *) echo "usage: docker/engine.sh engine|build-flags|run-flags|install" >&2; exit 2 ;;
  esac
fi
