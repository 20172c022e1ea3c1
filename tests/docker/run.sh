#!/usr/bin/env bash
# `make docker-test`: build the images, then run hbmcoll inside containers the ways users do.
#
#   tests/docker/run.sh [--no-build]
#
# Engine: docker when a Docker daemon answers, else podman (docker/engine.sh). Cases:
#   docker default seccomp (mbind refused): placement report, demo (4 ranks), the one refusal line
#     exactly once, the same with HBMCOLL_HBM_NODES=0 (KNL-style "buffers in HBM" + refusal), and
#     topology()["notices"] after init. Under podman "docker default" means podman with
#     --security-opt seccomp=<podman's profile with the memory-policy calls refused without
#     CAP_SYS_NICE> (docker/seccomp.py --docker-like); under Docker, Docker's own default.
#   --cap-add SYS_NICE (and podman's default profile): no refusal line.
#   hbmcoll:torch: the demo under torchrun.
#   --ipc none --network none: 96 MiB allreduce between 2 ranks with no /dev/shm at all.
#   --cpuset-cpus: the demo on one CPU (4 ranks oversubscribed); 2 ranks on CPU 0 stay on it, bound
#     without a failure (the plan follows the cgroup cpuset, also on cgroup v1).
#   two containers, one job: rank 0 in A, rank 1 in B, the same uid: 96 MiB allreduce, bcast, arena
#     allreduce when they share the network and PID namespaces of a holder container, the host's,
#     only the network namespace, only a volume with HBMCOLL_RENDEZVOUS_DIR, or only the IPC
#     namespace with HBMCOLL_RENDEZVOUS_DIR=/dev/shm (nothing left in the directory after); a
#     killed rank 0 in another PID namespace is reported as dead; the exact errors with separate
#     network namespaces and no rendezvous directory, and with another uid (docker/README.md).
#   two containers as two nodes (network namespaces on a bridge, own hostnames and IPC), 2 ranks
#     each under hbmcoll-run --nnodes 2: every collective across them.
#   dev image: the fast pytest subset ($DOCKER_PYTEST) and `make demo`.
# Every case's output is in build/docker-test/<case>.log. Ends with "docker-test: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=docker/engine.sh
. docker/engine.sh

IMAGE=${HBMCOLL_IMAGE:-hbmcoll}
RT=$IMAGE:latest
DEV=$IMAGE:dev
LOG=build/docker-test
PYTEST_ARGS=${DOCKER_PYTEST:-tests/py/test_api.py tests/py/test_launch.py tests/py/test_launchers.py}
t_start=$(date +%s)

if [ "${1:-}" != --no-build ]; then
  docker/build.sh || { echo "docker-test: 0 passed, 1 failed (the images did not build)"; exit 1; }
fi
t_built=$(date +%s)
rm -rf "$LOG" && mkdir -p "$LOG" build/docker

if [ "$ENGINE_KIND" = podman ]; then
  python3 docker/seccomp.py --docker-like >build/docker/seccomp-docker-like.json
  DOCKER_DEFAULT=(--security-opt seccomp="$PWD/build/docker/seccomp-docker-like.json")
else
  DOCKER_DEFAULT=()   # Docker's own default profile refuses mbind without CAP_SYS_NICE
fi
RUN=("${ENGINE[@]}" run "${RUN_FLAGS[@]}")
MOUNT=(-v "$PWD/tests/docker:/t:ro")
DEMO=(python3 -m hbmcoll.run -n 4 /opt/hbmcoll/examples/demo.py)
PREFIX="hbmcoll-test-$$"
NODES="hbd$$"   # the emulated nodes' namespaces: ${NODES}n0, ${NODES}n1, ${NODES}br
REFUSED='; but mbind is refused here, so memory stays on DDR near each CPU'

pass=0
failed=()
cleanup() {
  local n
  for n in "$PREFIX-b" "$PREFIX-a" "$PREFIX-ns" "$PREFIX-node0" "$PREFIX-node1"; do "${ENGINE[@]}" rm -f "$n" >/dev/null 2>&1 || true; done
}
trap 'cleanup; nodes_down 2>/dev/null' EXIT

# case NAME: run "$@" (an engine command line), output to $LOG/NAME.log, rc in $rc
case_run() {
  name=$1; shift
  local t0
  t0=$(date +%s)
  timeout 600 "$@" >"$LOG/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  errors=()
}
has() { grep -qxF -- "$1" "$LOG/$name.log" || errors+=("no line '$1'"); }
has_re() { grep -qE -- "$1" "$LOG/$name.log" || errors+=("nothing matches /$1/"); }
lacks() { ! grep -qF -- "$1" "$LOG/$name.log" || errors+=("unexpected '$1'"); }
count_re() {
  local n
  n=$(grep -cE -- "$2" "$LOG/$name.log")
  [ "$n" = "$1" ] || errors+=("$n lines match /$2/, expected $1")
}
rc_is() { [ "$rc" = "$1" ] || errors+=("exit code $rc, expected $1"); }
verdict() {
  if [ ${#errors[@]} -eq 0 ]; then
    pass=$((pass + 1))
    printf 'PASS  %-34s %3d s\n' "$name" "$secs"
  else
    failed+=("$name")
    printf 'FAIL  %-34s %3d s  %s (log: %s)\n' "$name" "$secs" "$(IFS=';'; echo "${errors[*]}")" "$LOG/$name.log"
    sed 's/^/      | /' "$LOG/$name.log" | tail -15
  fi
}
show() { sed -n "/$1/p" "$LOG/$name.log" | head -n "${2:-1}" | sed 's/^/      > /'; }

echo "== docker-test with ${ENGINE[*]}; logs in $LOG/"

# ---- Docker's default seccomp profile: mbind refused --------------------------------------------
case_run topo-docker-default "${RUN[@]}" --rm "${DOCKER_DEFAULT[@]}" "$RT" python3 -m hbmcoll.topo
rc_is 0; has "hbmcoll topology: this machine"; has_re '^  plan for [0-9]+ local ranks: '; verdict

case_run demo-docker-default "${RUN[@]}" --rm "${DOCKER_DEFAULT[@]}" "$RT" "${DEMO[@]}"
rc_is 0; has VERIFIED; count_re 1 "^hbmcoll: .*; but mbind is refused here, so memory stays on DDR near each CPU\$"
verdict; show 'mbind is refused'

case_run demo-docker-default-hbm0 "${RUN[@]}" --rm "${DOCKER_DEFAULT[@]}" -e HBMCOLL_HBM_NODES=0 "$RT" "${DEMO[@]}"
rc_is 0; has VERIFIED; has "hbmcoll: buffers in HBM (node 0, hbm_preferred)$REFUSED"; count_re 1 'mbind is refused'
verdict; show 'mbind is refused'

case_run notices-docker-default "${RUN[@]}" --rm "${DOCKER_DEFAULT[@]}" -e HBMCOLL_QUIET=1 "$RT" \
  python3 -c 'import hbmcoll; hbmcoll.init(); print(*hbmcoll.topology()["notices"], sep="\n")'
rc_is 0
has "mbind refused (Operation not permitted; a container without CAP_SYS_NICE?): memory stays on the default policy, DDR near each CPU"
verdict; show 'mbind refused'

# ---- memory policy allowed: --cap-add SYS_NICE (Docker), podman's default profile -------------
case_run demo-sys-nice "${RUN[@]}" --rm "${DOCKER_DEFAULT[@]}" --cap-add SYS_NICE -e HBMCOLL_HBM_NODES=0 "$RT" "${DEMO[@]}"
rc_is 0; has VERIFIED; has "hbmcoll: buffers in HBM (node 0, hbm_preferred)"; lacks refused; verdict; show '^hbmcoll:'

case_run topo-sys-nice "${RUN[@]}" --rm "${DOCKER_DEFAULT[@]}" --cap-add SYS_NICE "$RT" python3 -m hbmcoll.topo
rc_is 0; has "hbmcoll topology: this machine"; lacks refused; verdict

if [ "$ENGINE_KIND" = podman ]; then
  case_run demo-podman-default "${RUN[@]}" --rm "$RT" "${DEMO[@]}"
  rc_is 0; has VERIFIED; has_re '^hbmcoll: '; lacks refused; verdict; show '^hbmcoll:'
fi

# ---- the torch image: the same script under torchrun ------------------------------------------
case_run torchrun-torch-image "${RUN[@]}" --rm "${DOCKER_DEFAULT[@]}" --cap-add SYS_NICE "$IMAGE:torch" \
  torchrun --nproc-per-node 2 /opt/hbmcoll/examples/demo.py
rc_is 0; has VERIFIED; has_re '^hbmcoll demo: 2 ranks'; lacks refused; verdict

# ---- no /dev/shm, no network: segments are memfd passed over an abstract socket ---------------
case_run no-dev-shm "${RUN[@]}" --rm --ipc none --network none "${MOUNT[@]}" -e TWO_RANKS_SKEW=0 "$RT" \
  sh -c 'test ! -e /dev/shm && echo "no /dev/shm"; python3 -m hbmcoll.run -n 2 /t/two_ranks.py'
rc_is 0; has "no /dev/shm"; count_re 2 'allreduce of 96 MiB, bcast, arena allreduce: ok$'; verdict

# ---- one CPU for 4 ranks ----------------------------------------------------------------------
case_run demo-one-cpu "${RUN[@]}" --rm --cpuset-cpus 0 "$RT" "${DEMO[@]}"
rc_is 0; has VERIFIED; verdict

# The plan stays inside --cpuset-cpus: on cgroup v1 hwloc inside the container sees every CPU of
# the host, and numa/discover.c restricts it to the container's cpuset (saying so in a notice).
case_run cpuset-binding "${RUN[@]}" --rm --cpuset-cpus 0 "$RT" python3 -m hbmcoll.run -n 2 -- python3 -c \
  'import hbmcoll, os; c = hbmcoll.init(); print(f"rank {c.rank} | affinity {sorted(os.sched_getaffinity(0))}", *hbmcoll.topology()["notices"], sep=" | ")'
rc_is 0; count_re 2 '^rank [01] \| affinity \[0\] \|'; lacks 'binding to PUs'
if [ -f /sys/fs/cgroup/cpuset/cpuset.cpus ] && [ "$(getconf _NPROCESSORS_ONLN)" -gt 1 ]; then   # cgroup v1: said
  count_re 2 '\| hwloc saw PUs [0-9,-]+, the cgroup cpuset \(/sys/fs/cgroup/cpuset/cpuset.effective_cpus\) allows 0: planning on those \|'
fi
verdict; show '^rank 0' 1

# ---- two containers, one job --------------------------------------------------------------------
# A runs rank 0 (detached), B rank 1 (in front); MODE says which namespaces they share:
#   holder          a third container that only sleeps holds the network and PID namespaces and
#                   both rank containers join it (--network/--pid container:HOLDER)
#   host            --network host --pid host
#   separate-netns  nothing shared
#   separate-pidns  the network namespace shared (holder), each its own PID namespace
#   volume          nothing shared but a host directory, mounted as /rdv = HBMCOLL_RENDEZVOUS_DIR
#   ipc             nothing shared but the IPC namespace (holder with --ipc shareable), so /dev/shm,
#                   which is HBMCOLL_RENDEZVOUS_DIR
# TWO_KILL_A=S kills container A (rank 0) S seconds after B started. $leftover: what is left in the
# rendezvous directory afterwards.
# The ranks run under sh -c, so they are not pid 1 and (with `true &` in B) their pids differ
# between A and B, as under an init or a wrapper script.
two_containers() {   # NAME SKEW MODE
  local n=$1 skew=$2 mode=$3 shared=() killer=
  local env=(-e HBMCOLL_SIZE=2 -e HBMCOLL_LOCAL_SIZE=2 -e "HBMCOLL_JOB_KEY=$PREFIX-$n"
             -e "HBMCOLL_TIMEOUT=${TWO_TIMEOUT:-30}" -e "TWO_RANKS_SKEW=$skew")
  cleanup
  case "$mode" in
    holder|separate-pidns)
      "${RUN[@]}" -d --name "$PREFIX-ns" "$RT" sh -c 'trap "exit 0" TERM; sleep infinity & wait' >/dev/null
      shared=(--network "container:$PREFIX-ns")
      [ "$mode" = holder ] && shared+=(--pid "container:$PREFIX-ns") ;;
    host) shared=(--network host --pid host) ;;
    volume)
      rm -rf "$LOG/rdv" && mkdir -m 1777 "$LOG/rdv"   # the ranks run as uid 1000
      shared=(-v "$PWD/$LOG/rdv:/rdv" -e HBMCOLL_RENDEZVOUS_DIR=/rdv) ;;
    ipc)
      "${RUN[@]}" -d --name "$PREFIX-ns" --ipc shareable "$RT" sh -c 'trap "exit 0" TERM; sleep infinity & wait' >/dev/null
      shared=(--ipc "container:$PREFIX-ns" -e HBMCOLL_RENDEZVOUS_DIR=/dev/shm) ;;
  esac
  "${RUN[@]}" -d --name "$PREFIX-a" "${shared[@]}" "${MOUNT[@]}" "${env[@]}" -e HBMCOLL_RANK=0 \
    -e HBMCOLL_LOCAL_RANK=0 "$RT" sh -c 'python3 /t/two_ranks.py; exit $?' >/dev/null
  local bflags=()
  read -r -a bflags <<<"${TWO_B_FLAGS:-}"
  if [ -n "${TWO_KILL_A:-}" ]; then
    (sleep "$TWO_KILL_A"; "${ENGINE[@]}" kill "$PREFIX-a" >/dev/null 2>&1) &
    killer=$!
  fi
  case_run "$n" "${RUN[@]}" --name "$PREFIX-b" "${shared[@]}" "${bflags[@]}" "${MOUNT[@]}" "${env[@]}" -e HBMCOLL_RANK=1 \
    -e HBMCOLL_LOCAL_RANK=1 "$RT" sh -c 'true & true & true & wait; python3 /t/two_ranks.py; exit $?'
  [ -z "$killer" ] || wait "$killer"
  rc_a=$("${ENGINE[@]}" wait "$PREFIX-a" 2>/dev/null | tail -n 1)
  { echo "---- container A (rank 0), exit code $rc_a:"; "${ENGINE[@]}" logs "$PREFIX-a" 2>&1; } >>"$LOG/$n.log"
  case "$mode" in
    volume) leftover=$(ls -A "$LOG/rdv") ;;
    ipc) leftover=$("${ENGINE[@]}" exec "$PREFIX-ns" ls -A /dev/shm 2>&1) ;;
    *) leftover= ;;
  esac
  [ "$mode" = volume ] || [ "$mode" = ipc ] && echo "---- left in the rendezvous directory: ${leftover:-nothing}" >>"$LOG/$n.log"
  cleanup
}
nothing_left() { [ -z "$leftover" ] || errors+=("left in the rendezvous directory: $leftover"); }
two_ok() {
  rc_is 0; [ "$rc_a" = 0 ] || errors+=("container A exited with $rc_a")
  count_re 2 '^rank [01] of 2 .*allreduce of 96 MiB, bcast, arena allreduce: ok$'; verdict
  show '^rank [01] of 2' 2
}

two_containers two-containers-shared-ns 1 holder
two_ok
two_containers two-containers-host-ns 1 host
two_ok
# Peers are watched with pidfds passed at the rendezvous, valid in every PID namespace.
two_containers two-containers-separate-pidns 1 separate-pidns
two_ok
# Nothing shared but a directory (separate network, PID and IPC namespaces): a socket file there.
two_containers two-containers-shared-volume 1 volume
nothing_left; two_ok
two_containers two-containers-shared-ipc 1 ipc
nothing_left; two_ok
# Rank 0 is killed while rank 1 waits for it, from another PID namespace: reported at once.
TWO_TIMEOUT=60 TWO_KILL_A=8 two_containers two-containers-peer-killed 30 volume
rc_is 1; [ "$rc_a" = 137 ] || errors+=("container A exited with $rc_a, expected 137 (killed)")
has_re '^hbmcoll.PeerLostError: rank 0 \(pid [0-9]+\) died; the communicator is closed$'
[ "$secs" -lt 30 ] || errors+=("took $secs s: the death was not noticed before the timeout")
nothing_left; verdict; show '^hbmcoll.PeerLostError' 1

TWO_TIMEOUT=5 two_containers two-containers-separate-netns 0 separate-netns
rc_is 1; key="$PREFIX-two-containers-separate-netns"  # the secret is counted, never shown
has "hbmcoll.BootstrapError: rank 1 found no rank 0 listening for job key 'u1000.key.<HBMCOLL_JOB_KEY, ${#key} characters>/w1' in time"
lacks "$key"
has "hbmcoll.BootstrapError: rank 0 waited for the other ranks; 1 of 2 came (missing: 1)"; verdict
show '^hbmcoll.BootstrapError' 2

# Another uid: the socket name and the job key contain the uid, so the ranks never meet.
TWO_TIMEOUT=5 TWO_B_FLAGS="--user 1001" two_containers two-containers-other-uid 0 holder
rc_is 1; key="$PREFIX-two-containers-other-uid"  # the secret is counted, never shown
has "hbmcoll.BootstrapError: rank 1 found no rank 0 listening for job key 'u1001.key.<HBMCOLL_JOB_KEY, ${#key} characters>/w1' in time"
lacks "$key"
has "hbmcoll.BootstrapError: rank 0 waited for the other ranks; 1 of 2 came (missing: 1)"; verdict
show '^hbmcoll.BootstrapError' 1

# Two containers as two nodes: each in a network namespace of its own on a bridge (the emulated
# nodes of tests/py/netnodes.py), with its own hostname and IPC namespace; 2 ranks each under
# hbmcoll-run --nnodes 2, every collective across them (tests/py/across_job.py).
nodes_down() { python3 -c "import sys; sys.path.insert(0, 'tests/py'); import netnodes; netnodes.NetNodes(2, tag='$NODES').close()"; }
two_nodes() {   # NAME
  local n=$1 r
  cleanup
  if ! python3 -c "import sys; sys.path.insert(0, 'tests/py'); import netnodes; netnodes.NetNodes(2, tag='$NODES').__enter__()"; then
    case_run "$n" echo "could not make the emulated nodes (root and iproute2 needed)"
    rc=1 rc_b=1
    return
  fi
  for r in 1 0; do
    local how=(-d)
    [ "$r" = 0 ] && how=()
    local run=("${RUN[@]}" "${how[@]}" --name "$PREFIX-node$r" --network "ns:/run/netns/${NODES}n$r" --hostname "node$r"
               -v "$PWD/tests/py:/tp:ro" -e HBMCOLL_JOB_KEY="$PREFIX-$n" -e OMP_NUM_THREADS=1 -e HBMCOLL_TIMEOUT=120
               "$IMAGE:torch" python3 -m hbmcoll.run -n 2 --nnodes 2 --node-rank "$r" --master 10.77.0.1:29500
               python3 /tp/across_job.py)
    if [ "$r" = 1 ]; then "${run[@]}" >/dev/null; else case_run "$n" "${run[@]}"; fi
  done
  rc_b=$("${ENGINE[@]}" wait "$PREFIX-node1" 2>/dev/null | tail -n 1)
  { echo "---- node 1, exit code $rc_b:"; "${ENGINE[@]}" logs "$PREFIX-node1" 2>&1; } >>"$LOG/$n.log"
  cleanup
  nodes_down
}
two_nodes two-containers-two-nodes
rc_is 0; [ "$rc_b" = 0 ] || errors+=("node 1 exited with $rc_b")
count_re 4 '^rank [0-3] of 4 node [01] ok$'; has_re '^hbmcoll: 2 nodes x 2 ranks, 2 ring\(s\), bridge: provider tcp;ofi_rxm'
verdict; show '^hbmcoll: 2 nodes' 1

# ---- dev image: the fast pytest subset, make demo ---------------------------------------------
# shellcheck disable=SC2086
case_run pytest-dev "${RUN[@]}" --rm --network none -e HBMCOLL_KNOWN_BUGS=xfail "$DEV" \
  python3 -m pytest -q -p no:cacheprovider $PYTEST_ARGS
rc_is 0; has_re '^[0-9]+ passed'; verdict; show '^[0-9]+ (passed|failed)'

case_run make-demo-dev "${RUN[@]}" --rm "${DOCKER_DEFAULT[@]}" "$DEV" make demo
rc_is 0; has VERIFIED; count_re 1 'mbind is refused'; verdict

t_end=$(date +%s)
echo "== build $(( t_built - t_start )) s, tests $(( t_end - t_built )) s, total $(( t_end - t_start )) s"
[ ${#failed[@]} -eq 0 ] || echo "failed: ${failed[*]}"
echo "docker-test: $pass passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
