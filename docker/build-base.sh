#!/usr/bin/env bash
# Build the FROM image of docker/Dockerfile, debian:bookworm-slim, locally with debootstrap,
# for sites that reach Debian's package mirror but no container registry.
#
#   docker/build-base.sh [--engine "podman --runtime runc"|docker] [--tag T] [--mirror URL]
#                        [--force] [--pull]
#
# Without --force an image already stored under the tag is kept (seconds). --pull tries the
# registry first (`ENGINE pull`) and debootstraps only if that fails; the default never contacts a
# registry. The root file system is debootstrap's minbase variant trimmed the way the official
# -slim image is (no docs, man pages or locales; dpkg told to keep them out; no apt lists), with
# bookworm, bookworm-updates and bookworm-security in /etc/apt/sources.list.d/debian.sources.
# Needs root (debootstrap chroots), debootstrap and the engine; installs them with apt-get if
# missing. About 1-3 minutes; the image is ~75 MB.
set -euo pipefail

TAG=docker.io/library/debian:bookworm-slim
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
ENGINE=${ENGINE:-}
FORCE=0
PULL=0

while [ $# -gt 0 ]; do
  case "$1" in
    --engine) ENGINE=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --mirror) MIRROR=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    --pull) PULL=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-base.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

HERE=$(cd "$(dirname "$0")" && pwd)
if [ -z "$ENGINE" ]; then
  ENGINE=$("$HERE/engine.sh" engine)
fi
read -r -a ENG <<<"$ENGINE"

if [ "$FORCE" = 0 ] && "${ENG[@]}" image inspect "$TAG" >/dev/null 2>&1; then
  echo "build-base: $TAG is there already ($("${ENG[@]}" image inspect --format '{{.Created}}' "$TAG" 2>/dev/null)); --force rebuilds it"
  exit 0
fi

if [ "$PULL" = 1 ]; then
  echo "build-base: trying '${ENG[*]} pull $TAG'"
  if timeout 300 "${ENG[@]}" pull "$TAG"; then exit 0; fi
  echo "build-base: no registry reachable; building $TAG with debootstrap"
fi

if [ "$(id -u)" != 0 ]; then
  echo "build-base: debootstrap needs root (it chroots); run as root or with sudo" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null; then
  echo "build-base: installing debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

ROOT=$(mktemp -d "${TMPDIR:-/var/tmp}/hbmcoll-base.XXXXXX")
cleanup() { rm -rf --one-file-system "$ROOT"; }
trap cleanup EXIT

echo "build-base: debootstrap --variant=minbase $SUITE from $MIRROR"
t0=$(date +%s)
debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || {
  echo "build-base: debootstrap failed; last lines of $ROOT.log:" >&2
  tail -20 "$ROOT.log" >&2
  exit 1
}
rm -f "$ROOT.log"

# What the official -slim image does: keep docs, man pages and locales out for good.
mkdir -p "$ROOT/etc/dpkg/dpkg.cfg.d" "$ROOT/etc/apt/apt.conf.d"
cat >"$ROOT/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
# no docs, man pages or locales in container images (as the official -slim images)
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat >"$ROOT/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
echo 'APT::Install-Recommends "false";' >"$ROOT/etc/apt/apt.conf.d/docker-no-recommends"
rm -f "$ROOT/etc/apt/sources.list"
cat >"$ROOT/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
find "$ROOT/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
find "$ROOT/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf "$ROOT"/usr/share/{man,groff,info,lintian,linda}/* "$ROOT"/var/lib/apt/lists/* \
       "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/log/*.log \
       "$ROOT"/var/cache/debconf/*-old "$ROOT"/var/lib/dpkg/*-old "$ROOT"/tmp/* "$ROOT"/root/.bash_history
find "$ROOT/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} + 2>/dev/null || true
: >"$ROOT/etc/machine-id"
rm -f "$ROOT/etc/hostname" "$ROOT/etc/resolv.conf"   # the engine provides them

echo "build-base: importing as $TAG"
if ! out=$(tar --numeric-owner -C "$ROOT" -c . |
    "${ENG[@]}" import --change 'CMD ["bash"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --message "debootstrap --variant=minbase $SUITE $MIRROR (hbmcoll docker/build-base.sh)" \
      - "$TAG" 2>&1); then
  echo "build-base: ${ENG[*]} import failed: $out" >&2
  exit 1
fi
echo "build-base: $TAG built in $(( $(date +%s) - t0 )) s ($("${ENG[@]}" image inspect --format '{{.Size}}' "$TAG") bytes)"
