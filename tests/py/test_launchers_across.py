"""hbmcoll.init() across emulated nodes (netnodes.py) under each launcher but torchrun
(test_across_nodes.py), every rank running across_job.py (every collective against NumPy):

- hbmcoll-run on each node with --nnodes 2 --node-rank R --master 10.77.0.1; and 3 nodes with 1%
  of the frames between them dropped; Ctrl-C (through hbmcoll-run) of a rank waiting for another
  node: KeyboardInterrupt there at once, PeerLostError on the other node; a master address no
  node has: one clear error on each node (node 0 at once, the other when HBMCOLL_TIMEOUT ends);
  two nodes given one name (HBMCOLL_NODE): one clear error on both; node 0 (the rendezvous and
  the watch's relay) killed: PeerLostError on the other; a node whose link goes down
  in the middle of a loop of allreduces: PeerLostError on the other, no time limit set;
- MPICH's mpiexec (hydra) from node 0, reaching node 1 through an ssh stand-in that enters its
  namespace; 2 + 1 ranks, and ranks placed round-robin (ranks 0 and 2 on one node, 1 and 3 on
  the other); without MASTER_ADDR one clear error on every rank;
- the same hydra job handing hbmcoll.init() mpi4py's COMM_WORLD (UCX_TLS=tcp,self keeps MPICH's
  own traffic off the shared memory the namespaces still share);
- srun's environment as Slurm's step daemons set it for 2 nodes x 2 tasks, the rendezvous at the
  first host of SLURM_STEP_NODELIST (Slurm itself is not installed here).
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import netnodes

HERE = os.path.dirname(os.path.abspath(__file__))
PYMOD = os.path.join(HERE, "..", "..", "pymod")
JOB = os.path.join(HERE, "across_job.py")
KEY = "s" * 32


def _env(**extra):
    return dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY=KEY, **extra)


def _hbmcoll_run(nodes, nnodes, master, per_node=1, **env):
    """hbmcoll-run on each of the first nnodes nodes, node 0's address given as master."""
    return [nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", str(per_node), "--nnodes", str(nnodes),
                            "--node-rank", str(i), "--master", master, JOB],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(**env))
            for i in range(nnodes)]


def _check(res, counts):
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0, (i, out, err[-3000:])
    out = "".join(o for _, o, _ in res)
    assert out.count(" ok") == sum(counts), out


def test_hbmcoll_run_three_nodes_of_two(emulated_nodes):
    # beyond two nodes with several ranks each: alltoall's shifts then its local alltoall, the
    # small exchange in log2 steps, the pipelined allreduce
    nodes = emulated_nodes(3)
    procs = _hbmcoll_run(nodes, 3, "10.77.0.1:29810", per_node=2)
    res = netnodes.finish(procs, 300)
    _check(res, (2, 2, 2))
    assert "3 nodes x 2 ranks, 2 ring(s)" in res[0][2]


def test_hbmcoll_run_three_nodes_with_loss(emulated_nodes):
    nodes = emulated_nodes(3)
    nodes.loss(1)  # 1% of the bridge's frames dropped (nft): tcp retransmits, results stay exact
    procs = _hbmcoll_run(nodes, 3, "10.77.0.1:29820")
    res = netnodes.finish(procs, 300)
    _check(res, (1, 1, 1))
    assert "3 nodes x 1 rank, 1 ring(s)" in res[0][2]


def _node_lost(out):
    """The rank said it lost the other node: through the watched connection, or (when a transfer
    was in flight, as happens on a loaded machine) through the bridge's broken connection."""
    return ("lost: the connection to the job's other nodes closed" in out or
            "lost: a network transfer: the connection to another node's rank broke" in out)


def test_ctrl_c_while_waiting_on_another_node(emulated_nodes):
    nodes = emulated_nodes(2)
    procs = _hbmcoll_run(nodes, 2, "10.77.0.1:29830", MODE="interrupt")
    assert procs[0].stdout.readline().strip() == "waiting"
    time.sleep(1)
    procs[0].send_signal(signal.SIGINT)  # hbmcoll-run passes it on to its rank
    t0 = time.monotonic()
    (rc0, out0, err0), (rc1, out1, err1) = netnodes.finish(procs, 60)
    assert rc0 != 0 and "interrupted" in out0, (out0, err0[-2000:])
    assert time.monotonic() - t0 < 30
    assert rc1 == 5 and _node_lost(out1), (out1, err1[-2000:])


def test_a_wrong_master_is_one_clear_error(emulated_nodes):
    nodes = emulated_nodes(2)
    procs = _hbmcoll_run(nodes, 2, "10.77.0.9:29840", HBMCOLL_TIMEOUT="5")  # no node has 10.77.0.9
    (rc0, _, err0), (rc1, _, err1) = netnodes.finish(procs, 60)
    assert rc0 != 0 and "member 0 cannot listen at 10.77.0.9:29841 (Cannot assign requested address)" in err0, err0
    assert rc1 != 0 and "found no member 0 listening at 10.77.0.9:29841 in time" in err1, err1


def test_two_nodes_with_one_name_are_one_clear_error(emulated_nodes):
    nodes = emulated_nodes(2)
    procs = _hbmcoll_run(nodes, 2, "10.77.0.1:29850", HBMCOLL_NODE="twin")
    for rc, out, err in netnodes.finish(procs, 60):
        assert rc != 0 and "several nodes call themselves twin; give each node its own name with HBMCOLL_NODE" in err, err


def test_losing_the_node_that_holds_the_rendezvous(emulated_nodes):
    nodes = emulated_nodes(2)
    procs = _hbmcoll_run(nodes, 2, "10.77.0.1:29870", MODE="die", DIE="0")
    (rc0, _, _), (rc1, out1, err1) = netnodes.finish(procs, 90)
    assert rc0 != 0 and rc1 == 5 and _node_lost(out1), (out1, err1)


def test_a_node_whose_link_goes_down_is_lost(emulated_nodes):
    nodes = emulated_nodes(2)
    procs = _hbmcoll_run(nodes, 2, "10.77.0.1:29860", MODE="loop")
    assert [p.stdout.readline().strip() for p in procs] == ["looping"] * 2
    time.sleep(1)
    nodes.link_down(1)
    t0 = time.monotonic()
    (rc0, out0, err0), (rc1, out1, err1) = netnodes.finish(procs, 90)
    assert rc0 == 5 and "lost: the connection to the job's other nodes closed" in out0, (out0, err0[-2000:])
    assert time.monotonic() - t0 < 60
    assert rc1 != 0 and "hung" not in err1, (out1, err1[-2000:])


def _mpiexec(nodes, tmp_path, hosts, n, env, *args):
    if shutil.which("mpiexec.hydra") is None:
        pytest.skip("MPICH's hydra is not installed")
    ssh = nodes.ssh_stand_in(str(tmp_path / "ssh"))
    p = nodes.popen(0, ["mpiexec.hydra", "-launcher", "ssh", "-launcher-exec", ssh, "-hosts", hosts, "-n", str(n),
                        sys.executable, JOB, *args],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return netnodes.finish([p], 240)


@pytest.mark.parametrize("hosts,n", [("10.77.0.1:2,10.77.0.2:1", 3), ("10.77.0.1:1,10.77.0.2:1", 4)],
                         ids=["2+1", "round-robin"])
def test_mpiexec_hydra(emulated_nodes, tmp_path, hosts, n):
    res = _mpiexec(emulated_nodes(2), tmp_path, hosts, n, _env(MASTER_ADDR="10.77.0.1", UCX_TLS="tcp,self"))
    _check(res, (n,))
    if n == 4:  # hydra filled one slot per host in turn
        assert "rank 1 of 4 node 1 ok" in res[0][1] and "rank 2 of 4 node 0 ok" in res[0][1], res[0][1]


@pytest.mark.parametrize("hosts,n,extra", [("10.77.0.1:2,10.77.0.2:1", 3, []),
                                           ("10.77.0.1:2,10.77.0.2:2", 4, ["--map-by", "node"])],
                         ids=["2+1", "round-robin"])
def test_mpiexec_openmpi(emulated_nodes, tmp_path, hosts, n, extra):
    """Open MPI's mpiexec as its users run it across nodes: its rsh launcher (the ssh stand-in)
    starts orted on the other node, and -x passes the variables on."""
    if shutil.which("mpiexec.openmpi") is None:
        pytest.skip("Open MPI is not installed")
    nodes = emulated_nodes(2)
    ssh = nodes.ssh_stand_in(str(tmp_path / "ssh"))
    passed = [a for v in ("MASTER_ADDR", "HBMCOLL_JOB_KEY", "PYTHONPATH", "OMP_NUM_THREADS") for a in ("-x", v)]
    p = nodes.popen(0, ["mpiexec.openmpi", "--allow-run-as-root", "--mca", "plm_rsh_agent", ssh, "-H", hosts,
                        "-n", str(n), *extra, *passed, sys.executable, JOB],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(MASTER_ADDR="10.77.0.1"))
    res = netnodes.finish([p], 240)
    _check(res, (n,))
    if extra:  # one rank per node in turn
        assert "rank 1 of 4 node 1 ok" in res[0][1] and "rank 2 of 4 node 0 ok" in res[0][1], res[0][1]


def test_mpiexec_without_master_is_one_clear_error(emulated_nodes, tmp_path):
    env = _env(UCX_TLS="tcp,self")
    env.pop("MASTER_ADDR", None)
    res = _mpiexec(emulated_nodes(2), tmp_path, "10.77.0.1:1,10.77.0.2:1", 2, env)
    rc, out, err = res[0]
    assert rc != 0 and err.count("set MASTER_ADDR (or HBMCOLL_MASTER) to the address of rank 0's node") == 2, err


def test_mpi4py_comm_world(emulated_nodes, tmp_path):
    pytest.importorskip("mpi4py")
    res = _mpiexec(emulated_nodes(2), tmp_path, "10.77.0.1:2,10.77.0.2:1", 3,
                   _env(UCX_TLS="tcp,self", HBMCOLL_IFACE="hbnet0"), "mpi")
    _check(res, (3,))


def test_srun_environment(emulated_nodes):
    nodes = emulated_nodes(2)
    procs = []
    for node in range(2):
        for local in range(2):
            env = _env(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID=str(2 * node + local),
                       SLURM_STEP_NUM_TASKS="4", SLURM_LOCALID=str(local), SLURM_NODEID=str(node),
                       SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_STEP_NODELIST="10.77.0.[1-2]")
            procs.append(nodes.popen(node, [sys.executable, JOB], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env))
    _check(netnodes.finish(procs, 240), (4,))
