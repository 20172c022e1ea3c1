#!/bin/sh
# A job on 2 nodes with 4 ranks each, started by torchrun on every node (docs/multi-node.md).
#
#   node 0 (10.0.0.1):  examples/multinode_torchrun.sh 0 10.0.0.1 train.py
#   node 1:             examples/multinode_torchrun.sh 1 10.0.0.1 train.py
#
# train.py is any hbmcoll script (the README's Quick start, or dist.init_process_group("hbmcoll")
# with DDP): it needs no change to span nodes.
set -eu
NODE_RANK=${1:?usage: $0 NODE_RANK MASTER_ADDR SCRIPT [ARGS...]}   # 0 on the first node, 1 on the other
MASTER=${2:?the address of node 0, the same on both nodes}
shift 2

# The job's secret, the same on every node: nodes prove it to each other before any endpoint's
# address or key is sent, and a node without it is refused. Keep it in a file only you can read
# on a shared file system (made once: umask 077; python3 -c 'import secrets;
# print(secrets.token_hex(16))' > ~/.job-secret), or pass it in the environment.
HBMCOLL_JOB_KEY=${HBMCOLL_JOB_KEY:-$(cat ~/.job-secret)}
export HBMCOLL_JOB_KEY

# Optional: the interface the bridge between nodes uses (eth0, ib0, mlx5_0); by default the
# one that reaches MASTER. hbmcoll's rendezvous takes MASTER_PORT + 1 (one port per ring from
# there), beside torch's store on MASTER_PORT.
# export HBMCOLL_IFACE=ib0

exec torchrun --nnodes 2 --node-rank "$NODE_RANK" --nproc-per-node 4 \
    --master-addr "$MASTER" --master-port 29500 "$@"

# The same with hbmcoll's launcher (node R's ranks are 4R .. 4R+3):
#   hbmcoll-run -n 4 --nnodes 2 --node-rank "$NODE_RANK" --master "$MASTER:29500" python train.py
