"""How ranks leave a job, and what the others see (issue 30: 4, 9, 13, 14).

- a stranger that connects to the nodes' rendezvous and stays silent (or trickles, or claims a
  blob beyond the limit) is dropped and never delays the real nodes;
- ranks that make different numbers of collectives: the ones that finish close, and a rank
  still in a collective gets PeerLostError within seconds (saying the peer closed), whichever
  rank it is, on one node and across nodes; ranks that all finish alike close fast and clean;
- Ctrl-C after a request was dropped while its peers had not come arrives at once.
"""
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import netnodes
import ranks


# ---- (4) a silent stranger at the nodes' rendezvous -------------------------------------

STRANGER = r"""
import socket, struct, sys, time
kind, port, socks = sys.argv[1], int(sys.argv[2]), []
while len(socks) < 2:  # two, held open, before any other member comes
    try:
        socks.append(socket.create_connection(("10.77.0.1", port), timeout=1))
    except OSError:
        time.sleep(0.05)
if kind == "oversized":  # a head, a proof that is not one, then a blob length beyond the limit
    socks[0].sendall(b"HBMC1\0" + struct.pack("!I", 1) + bytes(32) + bytes(32) + struct.pack("!I", 1 << 30))
print("connected", flush=True)
for _ in range(60):
    for s in socks:
        if kind == "trickling":
            try:
                s.send(b"H")
            except OSError:
                pass
    time.sleep(0.5)
"""
MEMBER = "import numpy as np, hbmcoll\nc = hbmcoll.init(); x = np.ones(1); c.allreduce(x); print('sum', x[0])"


@pytest.mark.parametrize("stranger", ["silent", "trickling", "oversized"])
def test_a_stranger_at_the_rendezvous_does_not_hold_the_members(emulated_nodes, stranger):
    """Three nodes of one rank meet (libcoll/src/nodes_meet.c); two connections of a stranger on
    the third node's namespace, made before any member but node 0's, never delay them: they
    are dropped at the handshake's deadline (10 s) while the members go on."""
    nodes = emulated_nodes(3)
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="x" * 32, HBMCOLL_TIMEOUT="60")

    def member(i):
        return nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "1", "--nnodes", "3", "--node-rank", str(i),
                               "--master", "10.77.0.1:29940", sys.executable, "-c", MEMBER],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    procs = [member(0)]
    intruder = nodes.popen(2, [sys.executable, "-c", STRANGER, stranger, "29941"], stdout=subprocess.PIPE, text=True)
    try:
        assert intruder.stdout.readline().strip() == "connected"
        time.sleep(1)
        t0 = time.monotonic()
        procs += [member(1), member(2)]
        results = netnodes.finish(procs, 60)
        took = time.monotonic() - t0
    finally:
        intruder.kill()
        intruder.wait()
    for rc, out, err in results:
        assert rc == 0 and "sum 3.0" in out, (out, err[-2000:])
    assert took < 8, took  # not held for the stranger's sake (its deadline is 10 s after it connected)


def _abstract_names():
    with open("/proc/net/unix") as f:
        return {line.split()[-1] for line in f if line.split()[-1].startswith(f"@hbmcoll.{os.getuid()}.")}


def test_a_silent_connection_to_the_node_rendezvous_does_not_hold_the_ranks():
    """The same on one node: rank 0's abstract socket (found in /proc/net/unix), a silent
    connection of the same user made before rank 1 comes."""
    code = "import numpy as np, hbmcoll\nc = hbmcoll.init(); x = np.ones(2); c.allreduce(x); print('sum', x[0])"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HBMCOLL_", "PMI_", "MPI_LOCAL"))}
    env.update(PYTHONPATH=PYMOD, PMI_FD="9", PMI_SIZE="2", MPI_LOCALNRANKS="2", HBMCOLL_BIND="none")
    before = _abstract_names()
    procs = [subprocess.Popen([sys.executable, "-c", code], env=dict(env, PMI_RANK="0", MPI_LOCALRANKID="0"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    stranger = socket.socket(socket.AF_UNIX)
    try:
        t0 = time.monotonic()
        while not (_abstract_names() - before) and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        name = sorted(_abstract_names() - before)[0]
        stranger.connect("\0" + name[1:])  # and says nothing
        time.sleep(0.5)
        t0 = time.monotonic()
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=dict(env, PMI_RANK="1", MPI_LOCALRANKID="1"),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert all("sum 2.0" in o for o in outs), outs
        assert time.monotonic() - t0 < 40, outs  # the stranger's hello deadline, not the job's
    finally:
        stranger.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


# ---- (13) Ctrl-C while a dropped request waits for its peers ---------------------------

def _drop_then_wait(comm, then):
    if comm.rank == 0:
        ranks.event("dropping")
        t0 = time.monotonic()
        try:
            comm.iallreduce(np.ones(8))  # dropped at once: waits for rank 1, which never comes
            if then == "sleep":  # a blocking C call first: it checks for signals only if one comes
                time.sleep(30)
            else:
                while time.monotonic() - t0 < 30:
                    pass
            return "not interrupted"
        except KeyboardInterrupt:
            took = time.monotonic() - t0
        try:  # once, not twice
            time.sleep(1)
        except KeyboardInterrupt:
            return "interrupted twice"
        return f"interrupted after {took:.1f} s"
    time.sleep(60)
    return "slept"


@pytest.mark.parametrize("then", ["sleep", "python"])
def test_ctrl_c_while_a_dropped_request_drains_arrives_at_once(start_ranks, then):
    job = start_ranks(2, _drop_then_wait, then, env={"HBMCOLL_TIMEOUT": None}, timeout=90)
    job.wait_event(0, "dropping")
    time.sleep(1)
    job.signal(0, signal.SIGINT)
    t0 = time.monotonic()
    while _value(job, 0) is None and time.monotonic() - t0 < 40:
        job._pump(0.1)
    got = _value(job, 0)
    job.kill_all()
    assert got is not None and got.startswith("interrupted after"), job.report()
    assert float(got.split()[2]) < 10, got  # not when the 30 s wait ends


def _value(job, rank):
    r = job.results[rank]
    return r.value if r.status == "ok" else None


# ---- (9) uneven numbers of collectives: exit is a message ---------------------------------

EXITS_JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exits_job.py")
PYMOD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pymod")


def _two_nodes_run(nodes, port, busy):
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="e" * 32, BUSY=str(busy))
    env.pop("HBMCOLL_TIMEOUT", None)  # no deadline: a hang would be one
    procs = [nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "1", "--nnodes", "2", "--node-rank", str(i),
                             "--master", f"10.77.0.1:{port}", EXITS_JOB],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    return netnodes.finish(procs, 120)


@pytest.mark.parametrize("busy", [0, 1, -1], ids=["member-0-busy", "member-1-busy", "even"])
def test_across_nodes_a_rank_left_in_a_collective_is_told_at_once(emulated_nodes, busy):
    res = _two_nodes_run(emulated_nodes(2), 29870 + busy + 1, busy)
    for i, (rc, out, err) in enumerate(res):
        assert "hung" not in err, (i, out, err[-2000:])
        if i == busy:
            assert rc != 0 and "lost after" in out and "closed the communicator while this rank is in a collective they never made" in out, \
                (i, out, err[-2000:])
            assert float(out.split("lost after ")[1].split()[0]) < 10, out  # not the 60 s of a goodbye
        else:
            assert rc == 0 and "done after" in out, (i, out, err[-2000:])
            assert float(out.split("done after ")[1].split()[0]) < 10, out


def _uneven(comm, busy):
    import hbmcoll
    for _ in range(3):
        comm.allreduce(np.ones(1000, dtype=np.float32))
    t0 = time.monotonic()
    try:
        if comm.rank == busy:
            comm.allreduce(np.ones(1000, dtype=np.float32))  # the others never make this one
        comm.close()
        return ("done", time.monotonic() - t0, "")
    except hbmcoll.Error as e:
        return (type(e).__name__, time.monotonic() - t0, str(e))


@pytest.mark.parametrize("busy", [0, 2, -1], ids=["rank-0-busy", "rank-2-busy", "even"])
def test_on_one_node_a_rank_left_in_a_collective_is_told_at_once(run_ranks, busy):
    got = run_ranks(3, _uneven, busy, env={"HBMCOLL_TIMEOUT": None}, timeout=90)
    for r, (kind, took, why) in enumerate(got):
        if r == busy:
            assert kind == "PeerLostError" and ("left" in why or "closed" in why), got
            assert "died" not in why and "timed out" not in why, got
        else:
            assert kind == "done", got
        assert took < 10, got


# ---- (14) a node's ranks that fail init alike each report it under torchrun -----------------

SLOW_REPORT = """
import os, sys, time
if os.environ.get("LOCAL_RANK") == os.environ.get("SLOW_REPORT_RANK"):
    _hook = sys.excepthook
    def _slow(*a):
        time.sleep(2)  # a loaded machine keeps this rank from its report a moment
        _hook(*a)
    sys.excepthook = _slow
"""


@pytest.mark.parametrize("slow", [0, 1], ids=["local-rank-0-slow", "local-rank-1-slow"])
def test_every_rank_reports_a_bad_node_though_one_is_slow_to(emulated_nodes, tmp_path, monkeypatch, slow):
    """torchrun stops a node's ranks once one has exited: a rank slower to print its error
    than its sibling was to exit said nothing (issue 30, case 14)."""
    pytest.importorskip("torch")
    import test_across_nodes as across
    (tmp_path / "sitecustomize.py").write_text(SLOW_REPORT)
    says = "node node1's bridge is on a loopback interface (127.0.0.1)"
    monkeypatch.setattr(across, "PYMOD", f"{tmp_path}:{across.PYMOD}")  # the ranks' PYTHONPATH
    res = across._torchrun(emulated_nodes(2), 2, 29760 + slow, {"HBMCOLL_JOB_KEY": "k" * 32, "SLOW_REPORT_RANK": str(slow)},
                           second_node_env={"HBMCOLL_IFACE": "lo"})
    for i, (rc, out, err) in enumerate(res):
        assert rc != 0 and err.count(says) == 2, (i, err[-3000:])
        assert "hung" not in err
