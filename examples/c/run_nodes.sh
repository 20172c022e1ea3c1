#!/bin/sh
# examples/c/run_nodes.sh PROGRAM - run PROGRAM with hbmcoll-run across 2 emulated nodes x 2 ranks:
# two network namespaces on one bridge (10.77.0.1 and 10.77.0.2 on hbnet0, as tests/py/netnodes.py
# makes them), `hbmcoll-run -n 2 --nnodes 2 --node-rank R --master 10.77.0.1:PORT` in each, the same
# HBMCOLL_JOB_KEY on both. Needs root and iproute2; otherwise it says so and exits 0 (a skip).
# PYTHON (default python3) runs hbmcoll.run. IPV6=1: the nodes have only IPv6 addresses
# (fd00:77::1 and ::2), and the master is given as [fd00:77::1]:PORT.
set -u
prog=$1
py=${PYTHON:-python3}
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "run_nodes.sh: skipped (emulated nodes need root and iproute2)"; exit 0
fi
tag=hbx$$
cleanup() { for n in ${tag}n0 ${tag}n1 ${tag}br; do ip netns del $n 2>/dev/null; done; }
trap cleanup EXIT INT TERM
add="addr add 10.77.0." len="/24 dev hbnet0"
[ "${IPV6:-}" = 1 ] && add="-6 addr add fd00:77::" len="/64 dev hbnet0 nodad" # nodad: usable at once
ip netns add ${tag}br && ip -n ${tag}br link add hbbr0 type bridge && ip -n ${tag}br link set hbbr0 up || exit 1
for i in 0 1; do
  n=${tag}n$i
  ip netns add $n && ip link add hbnet0 netns $n type veth peer name hbp$i netns ${tag}br &&
    ip -n ${tag}br link set hbp$i master hbbr0 up && ip -n $n $add$((i + 1))$len &&
    ip -n $n link set hbnet0 up && ip -n $n link set lo up || exit 1
done
port=$((29000 + $$ % 500 * 2))
master=10.77.0.1:$port
[ "${IPV6:-}" = 1 ] && master=[fd00:77::1]:$port
HBMCOLL_JOB_KEY=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
HBMCOLL_TIMEOUT=${HBMCOLL_TIMEOUT:-120}
export HBMCOLL_JOB_KEY HBMCOLL_TIMEOUT
for i in 0 1; do
  HBMCOLL_NODE=node$i ip netns exec ${tag}n$i $py -m hbmcoll.run -n 2 --nnodes 2 --node-rank $i \
    --master "$master" "$prog" &
  eval pid$i=$!
done
rc=0
wait $pid0 || rc=1
wait $pid1 || rc=1
exit $rc
