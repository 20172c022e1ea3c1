#!/usr/bin/env bash
# `make bench-docker`: the benchmark suite inside the dev image, results beside bare metal's.
#
#   docker/bench.sh [suite options]        default: --quick
#
# Runs `python3 -m hbmcoll.bench --quick --out /results` in hbmcoll:dev with the checkout's bench/
# mounted read-only (the same suite as bare metal) and bench/results/docker-<timestamp>/ mounted as
# /results: the run lands in bench/results/docker-<timestamp>/<suite timestamp>/ (and .../latest).
# Compare with a bare-metal run:
#   python3 bench/compare.py metal=bench/results/latest docker=bench/results/docker-<timestamp>/latest
# Container flags: --cap-add SYS_NICE (memory placement as on bare metal; BENCH_DOCKER_FLAGS
# replaces the defaults, e.g. BENCH_DOCKER_FLAGS="--shm-size=1g" for Docker's default seccomp),
# --shm-size=1g (MPICH's shared memory lives in /dev/shm; hbmcoll does not need it).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=docker/engine.sh
. docker/engine.sh
set -e
IMAGE=${HBMCOLL_IMAGE:-hbmcoll}
docker/build.sh dev
set +e
read -r -a FLAGS <<<"${BENCH_DOCKER_FLAGS:---cap-add SYS_NICE --shm-size=1g}"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--quick)

stamp=$(date +%Y%m%d-%H%M%S)
out=bench/results/docker-$stamp
mkdir -p "$out"
chmod 0777 "$out"          # the container's user (uid 1000) writes there
mounts=(-v "$PWD/$out:/results")
if [ -f bench/suite.py ]; then
  mounts+=(-v "$PWD/bench:/home/hbm/hbmcoll/bench:ro")
else
  echo "bench-docker: no bench/suite.py in this checkout; hbmcoll.bench will say what is missing" >&2
fi
echo "== ${ENGINE[*]} run ${FLAGS[*]} $IMAGE:dev python3 -m hbmcoll.bench ${args[*]} --out /results  (-> $out/)"
t0=$(date +%s)
"${ENGINE[@]}" run --rm "${RUN_FLAGS[@]}" "${FLAGS[@]}" "${mounts[@]}" "$IMAGE:dev" \
  python3 -m hbmcoll.bench "${args[@]}" --out /results 2>&1 | tee "$out/console.log"
rc=${PIPESTATUS[0]}
chmod 0755 "$out"; [ "$(id -u)" != 0 ] || chown -R --reference=bench/results "$out"   # files the container user wrote
echo "bench-docker: exit code $rc after $(( $(date +%s) - t0 )) s; results in $out/"
exit "$rc"
