"""What the rendezvous of nodes says when it fails, on every rank of every node (emulated nodes):

- nodes that disagree on the job: what differs and on which node (the job's size, from --nnodes or
  ranks per node);
- a node that never comes: member 0 names the nodes that came and the ranks missing, in a line
  after 10 s and in its error; the node's other ranks say the same, not a timeout of their own;
- a node with another secret: it is told member 0 holds another secret, and node 0 names the
  address it refused and why;
- a stranger that connects to member 0 proves first: before it does, all it gets is a nonce, nothing
  keyed that a weak secret could be guessed against offline; a wrong proof gets a refusal at once;
- a secret too short to keep strangers from guessing it is refused on every rank at once;
- a stranger opening connections to member 0 non-stop keeps no node out.
Before, node 0's ranks said only "rank 1 timed out after 8 s waiting for rank 0"."""
import json
import os
import re
import select
import subprocess
import sys
import time

import pytest

import netnodes

HERE = os.path.dirname(os.path.abspath(__file__))
PYMOD = os.path.join(HERE, "..", "..", "pymod")


def test_nodes_launched_with_different_nnodes_fail_at_once_on_both(emulated_nodes):
    nodes = emulated_nodes(2)
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="n" * 32,
               HBMCOLL_TIMEOUT="60")
    prog = [sys.executable, "-c", "import hbmcoll; hbmcoll.init(); print('formed')"]
    procs = [nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "1", "--nnodes", str(2 + i), "--node-rank",
                             str(i), "--master", "10.77.0.1:29890"] + prog,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    for rc, out, err in netnodes.finish(procs, 50):  # within the 60 s a timeout would take
        assert rc != 0 and "formed" not in out, (out, err[-2000:])
        assert "the nodes disagree on the job's size (ranks in all)" in err, err[-2000:]


def _job(nodes, node_env, timeout):
    """hbmcoll-run -n 2 on each node given an environment (None: not started); their results.
    Output is tagged: two ranks failing at once would otherwise interleave their tracebacks."""
    procs = []
    for i, extra in enumerate(node_env):
        if extra is None:
            continue
        env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="s" * 32,
                   HBMCOLL_TIMEOUT=str(timeout))
        env.update(extra)
        procs.append(nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "2", "--tag-output", "--nnodes", "2",
                                     "--node-rank", str(i), "--master", "10.77.0.1:29900", sys.executable, "-c",
                                     "import hbmcoll; hbmcoll.init()"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    return netnodes.finish(procs, timeout + 40)


def _errors(err):
    """The BootstrapError line of each rank (tagged '[rank] ')."""
    return [line for line in err.splitlines() if re.match(r"\[\d+\] hbmcoll\.BootstrapError", line)]


def test_a_missing_node_is_named_after_10_s_and_in_every_ranks_error(emulated_nodes):
    (rc, _, err), = _job(emulated_nodes(2), [{}, None], 14)
    assert rc != 0
    assert "the rendezvous at 10.77.0.1:29901 has waited 10 s: nodes " in err, err[-3000:]
    errors = _errors(err)
    assert len(errors) == 2 and all("missing: the nodes of ranks 2-3" in e for e in errors), err[-3000:]
    assert "timed out" not in err, err[-3000:]


def test_a_node_with_another_secret_is_named_on_both_nodes(emulated_nodes):
    (rc0, _, err0), (rc1, _, err1) = _job(emulated_nodes(2), [{}, {"HBMCOLL_JOB_KEY": "t" * 32}], 8)
    assert rc0 != 0 and rc1 != 0
    errors0 = _errors(err0)
    assert len(errors0) == 2, err0[-3000:]
    assert all("refused connections from 10.77.0.2" in e and "another HBMCOLL_JOB_KEY" in e for e in errors0), errors0
    assert err1.count("member 0 at 10.77.0.1:29901 holds another secret than ours: refused") >= 2, err1[-3000:]


STRANGER = r"""
import json, os, socket, struct, sys, time
until = time.monotonic() + 20
while True:  # member 0 may not listen yet
    try:
        s = socket.create_connection(("10.77.0.1", 29901), timeout=2)
        break
    except OSError:
        if time.monotonic() > until:
            raise
        time.sleep(0.1)
def take(seconds):
    s.settimeout(seconds)
    got = b""
    try:
        while True:
            part = s.recv(4096)
            if not part:
                return got, "closed"
            got += part
    except socket.timeout:
        return got, "open"
s.sendall(b"HBMC2\0" + struct.pack(">I", 1) + os.urandom(32))
first = take(1.5)
s.sendall(os.urandom(32))  # a guessed proof
second = take(5)
print(json.dumps([[first[0].hex(), first[1]], [second[0].hex(), second[1]]]))
"""


def test_a_stranger_gets_a_nonce_and_nothing_keyed_then_a_refusal(emulated_nodes):
    nodes = emulated_nodes(2)
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="s" * 32, HBMCOLL_TIMEOUT="14")
    job = nodes.popen(0, [sys.executable, "-m", "hbmcoll.run", "-n", "1", "--nnodes", "2", "--node-rank", "0",
                          "--master", "10.77.0.1:29900", sys.executable, "-c", "import hbmcoll; hbmcoll.init()"],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stranger = nodes.popen(1, [sys.executable, "-c", STRANGER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    (rc_s, out_s, err_s), (rc0, _, err0) = netnodes.finish([stranger, job], 60)
    assert rc_s == 0, err_s[-2000:]
    (nonce, still), (refusal, end) = json.loads(out_s)
    # before its proof: 32 bytes (member 0's nonce) and the connection open, waiting; no proof of member 0's
    assert len(nonce) == 64 and still == "open", out_s
    assert refusal == "52" + "00" * 32 and end == "closed", out_s  # 'R', and closed
    assert rc0 != 0 and "refused connections from 10.77.0.2: it does not hold the job's secret" in err0, err0[-3000:]


def test_a_short_secret_is_refused_on_every_rank_at_once(emulated_nodes):
    res = _job(emulated_nodes(2), [{"HBMCOLL_JOB_KEY": "short-key"}] * 2, 60)
    for rc, _, err in res:
        lines = [e for e in err.splitlines() if re.match(r"\[\d+\] hbmcoll\.\w+Error", e)]
        assert rc != 0 and len(lines) == 2, err[-3000:]
        assert all("HBMCOLL_JOB_KEY) has 9 characters: across nodes it needs 16 or more" in e for e in lines), lines
        assert "hung" not in err, err[-3000:]


FLOOD = r"""
import resource, socket, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
kept, held, opened = [], [], 0
while True:  # bursts of connections, none waiting for the last, never a word said; paced, so
    time.sleep(0.005)  # member 0 accepts each (one that fills the listen queue is the kernel's part)
    for _ in range(64):
        try:
            sock = socket.socket()
        except OSError:  # out of descriptors: let the oldest go
            if held:
                held.pop(0).close()
            continue
        sock.setblocking(False)
        if sock.connect_ex(("10.77.0.1", 29901)) not in (0, 115):  # (EINPROGRESS)
            sock.close()
            continue
        opened += 1
        (kept if len(kept) < 256 else held).append(sock)  # the first ones, which member 0 took, kept open
        if len(held) > min(4000, hard - 600):
            held.pop(0).close()
    if opened >= 1024:
        print(opened, time.monotonic(), flush=True)  # (one clock for every namespace)
        opened = 0
"""


def _flooding_after(p, t, seconds=10):
    """Whether the stranger p says it opened connections after time t (CLOCK_MONOTONIC)."""
    fd, got, until = p.stdout.fileno(), b"", time.monotonic() + seconds
    os.set_blocking(fd, False)
    while time.monotonic() < until:
        select.select([fd], [], [], 0.2)
        try:
            part = os.read(fd, 1 << 16)
        except BlockingIOError:
            continue
        if not part:  # it exited
            return False
        got += part
        if any(len(w := line.split()) == 2 and float(w[1]) > t for line in got.split(b"\n")[:-1]):
            return True
    return False


def test_a_stranger_connecting_non_stop_keeps_no_node_out(emulated_nodes):
    # Before, member 0 closed every newcomer while 64 handshakes were under way: a stranger that
    # kept 64 open kept the nodes out until the job's timeout. Now a newcomer pushes out the oldest
    # handshake of the address holding the most, the stranger's own.
    nodes = emulated_nodes(3)  # node 2: the stranger's
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="f" * 32, HBMCOLL_TIMEOUT="9")
    prog = [sys.executable, "-c", "import hbmcoll; c = hbmcoll.init(); print('formed', c.size)"]

    def node(i):
        return nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "1", "--nnodes", "2", "--node-rank", str(i),
                               "--master", "10.77.0.1:29900"] + prog,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    job = [node(0)]
    flood = nodes.popen(2, [sys.executable, "-c", FLOOD], stdout=subprocess.PIPE, bufsize=0)
    try:
        assert _flooding_after(flood, 0), "the stranger could not start"
        time.sleep(1)  # member 0 is full of the stranger's handshakes
        job.append(node(1))
        res = netnodes.finish(job, 60)
        assert _flooding_after(flood, time.monotonic()), "the stranger stopped early"
    finally:
        netnodes.kill_tree(flood.pid)
        flood.wait()
    for rc, out, err in res:
        assert rc == 0 and "formed 2" in out, err[-3000:]
