"""Strangers on the bridge: a process with no job key and no token, in a namespace of its own on
the emulated nodes' bridge (netnodes.py), finds the libfabric ports of a job's ranks or of a
memory server (`ss -tln` in their namespaces) and hammers them (tests/c/stranger.c): writes with
the key every pool once had (0xC011) at offset 0 and beyond, a few guessed keys, and forged notes
as writes, sends and injects.

- two nodes allreduce in a loop under the hammering: every result is right on every rank, and
  the notes the stranger sent are dropped where they arrived (the one line on stderr);
- two nodes send and receive (ANY_SOURCE, ANY_TAG) in a loop while the stranger sends tagged
  messages into every port of theirs (forged ranks, the users' tags, any tag): every message taken
  is the job's, from the rank it says, with the bytes it sent;
- a memory server under the hammering: a client's buffer keeps its bytes and its version; notes
  naming client 0, from the stranger and from another client that holds the token, are dropped
  (MemServe's line on stderr) and client 0 is still served.
"""
import os
import select
import signal
import subprocess
import sys
import time

import pytest

import netnodes

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PYMOD = os.path.join(ROOT, "pymod")
STRANGER = os.path.join(ROOT, "build", "ctest", "stranger")
ENV = dict(os.environ, FI_PROVIDER="tcp", FI_TCP_IFACE="hbnet0", PYTHONPATH=PYMOD)
STRANGER_OPS = 3000  # what the stranger posts while the nodes allreduce


@pytest.fixture(scope="module")
def stranger():
    """The stranger's binary (built by `make ctest`; built here when missing)."""
    if not os.path.exists(STRANGER):
        subprocess.run(["make", "-s", "build/ctest/stranger"], cwd=ROOT, check=True)
    return STRANGER


def _line(p, want, timeout=60):
    """The first line of p's stdout that has want (the others are kept in the return's text)."""
    seen, until = "", time.monotonic() + timeout
    while time.monotonic() < until:
        if select.select([p.stdout], [], [], 0.5)[0]:
            line = p.stdout.readline()
            if not line:
                break
            seen += line
            if want in line:
                return seen
    try:
        p.wait(timeout=5)
        why = p.stderr.read()[-2000:]
    except subprocess.TimeoutExpired:
        why = "(still running)"
    raise AssertionError(f"no {want!r} from process {p.pid}: {seen} {why}")


def _ports(nodes, i, skip):
    """The TCP ports listening in node i's namespace, but the ones in skip."""
    out = subprocess.run(["ip", "netns", "exec", nodes.names[i], "ss", "-tlnH"], capture_output=True, text=True,
                         check=True).stdout
    ports = {int(f.split()[3].rpartition(":")[2]) for f in out.splitlines() if f.strip()}
    return sorted(ports - set(skip))


def _ring_ports(nodes, i):
    """Node i's ports that listen and have taken a connection: the bridge's endpoints a neighbour
    writes to (send/recv's endpoints, which take no writes, are idle while the job allreduces)."""
    listening = set(_ports(nodes, i, []))
    out = subprocess.run(["ip", "netns", "exec", nodes.names[i], "ss", "-tnH"], capture_output=True, text=True,
                         check=True).stdout
    return sorted({int(f.split()[3].rpartition(":")[2]) for f in out.splitlines() if f.strip()} & listening)


def _hammer(nodes, stranger, targets, *args):
    p = nodes.popen(2, [stranger, "--iface", "hbnet0", *args, *targets], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True, env=ENV)
    _line(p, "stranger: hammering")
    return p


def _posted(hammer, ranks):
    """The stranger's lines until it posted STRANGER_OPS (it got through to them), or a rank ended."""
    seen, until = "", time.monotonic() + 300
    while f"stranger: {STRANGER_OPS} posted" not in seen and time.monotonic() < until:
        if any(p.poll() is not None for p in ranks):
            break
        if select.select([hammer.stdout], [], [], 0.5)[0]:
            seen += hammer.stdout.readline()
    return seen


def _stop(p):
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    return out + err


MEMBER = r"""
import os, sys, time, numpy as np
import hbmcoll
flag = sys.argv[1]
c = hbmcoll.init()
print("ready", flush=True)
while not os.path.exists(flag + ".go"):
    time.sleep(0.05)
wrong, failed, rounds, me = 0, [], 0, c.rank
while rounds < 10 ** 7:  # until told (a file) that the stranger did enough
    stop = np.array([os.path.exists(flag + ".stop")], np.int32)
    count = (1000, 1 << 16, 7)[rounds % 3]
    x = (np.arange(count, dtype=np.float32) % 97) * (me + 1) + rounds
    try:
        c.allreduce(x)
        c.allreduce(stop)  # both ranks stop after the same round
    except hbmcoll.Error as e:
        failed.append(f"{type(e).__name__}: {e}")
        break
    wrong += not np.array_equal(x, (np.arange(count, dtype=np.float32) % 97) * 3 + 2 * rounds)
    rounds += 1
    if stop[0]:
        break
print(f"rounds {rounds} wrong {wrong} failed {failed}", flush=True)
c.close()
"""


def _job(nodes, port, code, flag, key):
    """hbmcoll-run of one rank on each of nodes 0 and 1, running code with flag."""
    env = dict(ENV, HBMCOLL_JOB_KEY=key)
    return [nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "1", "--nnodes", "2", "--node-rank", str(i),
                            "--master", f"{nodes.addrs[0]}:{port}", sys.executable, "-c", code, flag],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]


def test_a_stranger_cannot_touch_an_allreduce_across_nodes(emulated_nodes, stranger, tmp_path):
    nodes = emulated_nodes(3)  # node 2: the stranger's
    flag = str(tmp_path / "flag")
    ranks = _job(nodes, 29631, MEMBER, flag, "strangers-ring-key-0123456789abcdef")
    hammer = None
    try:
        for p in ranks:
            _line(p, "ready")
        targets = [f"{nodes.addrs[i]}:{q}" for i in range(2) for q in _ring_ports(nodes, i)]
        assert targets, targets  # (one connection joins the two ring members: one end took it)
        hammer = _hammer(nodes, stranger, targets, "--notes", "nodes")
        open(flag + ".go", "w").close()
        seen = _posted(hammer, ranks)
        early = [i for i, p in enumerate(ranks) if p.poll() is not None]
        open(flag + ".stop", "w").close()
        res = netnodes.finish(ranks, 300)
    finally:
        for p in ranks:
            if p.poll() is None:
                netnodes.kill_tree(p.pid)
        said = _stop(hammer) if hammer else ""
    assert "stranger: posted" in said, said
    assert not early, ("ranks that stopped before they were told", early, res)
    assert f"stranger: {STRANGER_OPS} posted" in seen, (seen, said)
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and " wrong 0 failed []" in out and "rounds 0 " not in out, (i, out, err[-2000:], said)
    # the stranger's notes arrived, and were refused: the one line where they did
    assert any("dropped a note from an address that is no peer" in err for _, _, err in res), (res, said)


CLIENT = r"""
import sys, numpy as np
import hbmcoll
addr, role = sys.argv[1], sys.argv[2]
rb = hbmcoll.RemoteBuffer("victim", (1 << 14,), "float32", servers=addr, token="strangers-token-0123", timeout=30)
conn = rb._parts[0][0]
if role == "forger":  # holds the token, and names client 0 in notes of its own writes
    for k in range(64):
        conn.ep.write(conn.peer, 0, conn.slot, 64, 0 | ((k & 1) << 16), 30)
    conn.ep.flush(30)
    print("forged", conn.index, flush=True)
    sys.exit(0)
mine = np.arange(1 << 14, dtype=np.float32)
rb.write(mine)
print("ready", conn.index, rb.version, flush=True)
sys.stdin.readline()  # the stranger and the forger are at work
bad = []
for r in range(20):
    got = rb.read()
    if not np.array_equal(got, mine + r) or rb.version != 1 + r:
        bad.append((r, rb.version, got[:2].tolist()))
    rb.accumulate(np.ones_like(mine))  # still served: a client dropped gets PeerLostError here
print("bad", bad, flush=True)
"""


def test_a_stranger_cannot_touch_a_memory_server(emulated_nodes, stranger, tmp_path):
    nodes = emulated_nodes(3)  # node 0: the server, node 1: its clients, node 2: the stranger
    fd = os.open(tmp_path / "token", os.O_WRONLY | os.O_CREAT, 0o600)  # private, as a server wants it
    os.write(fd, b"strangers-token-0123\n")
    os.close(fd)
    port = 29641
    addr = f"{nodes.addrs[0]}:{port}"
    server = nodes.popen(0, [sys.executable, "-m", "hbmcoll.memserver", "--listen", addr, "--token-file",
                             str(tmp_path / "token"), "--capacity", "16M"], stderr=subprocess.PIPE, text=True, env=ENV)
    procs, hammer = [server], None
    try:
        assert "bytes for buffers at" in server.stderr.readline()
        client = nodes.popen(1, [sys.executable, "-c", CLIENT, addr, "victim"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        procs.append(client)
        assert "ready 0 1" in _line(client, "ready")  # client 0, its buffer at the pool's start
        targets = [f"{nodes.addrs[0]}:{q}" for q in _ports(nodes, 0, [port])]
        assert len(targets) == 1, targets  # the server's endpoint
        hammer = _hammer(nodes, stranger, targets, "--notes", "client0", "--span", "65536")
        forger = nodes.popen(1, [sys.executable, "-c", CLIENT, addr, "forger"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV)
        procs.append(forger)
        (frc, fout, ferr), = netnodes.finish([forger], 120)
        assert frc == 0 and "forged 1" in fout, (fout, ferr[-2000:])
        client.stdin.write("go\n")
        client.stdin.flush()
        (rc, out, err), = netnodes.finish([client], 120)
        said = _stop(hammer)
        hammer = None
        server.send_signal(signal.SIGTERM)
        _, serr = server.communicate(timeout=30)
    finally:
        if hammer:
            _stop(hammer)
        for p in procs:
            if p.poll() is None:
                netnodes.kill_tree(p.pid)
    assert "stranger: posted" in said, said
    assert rc == 0 and "bad []" in out, (out, err[-2000:], serr[-2000:])
    assert "memory server dropped a note naming client 0 from another client" in serr, serr[-2000:]
    assert "dropped a note from an address that is no peer" in serr, serr[-2000:]


P2P = r"""
import os, sys, time, numpy as np
import hbmcoll
flag = sys.argv[1]
c = hbmcoll.init()
print("ready", flush=True)
while not os.path.exists(flag + ".go"):
    time.sleep(0.05)
wrong, rounds, other = 0, 0, 1 - c.rank
st, got = hbmcoll.Status(), np.empty(8)
while rounds < 200000:
    stop = np.array([os.path.exists(flag + ".stop")], np.int32)
    c.allreduce(stop)  # both ranks stop after the same round
    if stop[0]:
        break
    for turn in range(2):
        if turn == c.rank:
            c.send(np.full(8, rounds * 2.0 + c.rank), other, tag=rounds % 7)
        else:
            c.recv(got, hbmcoll.ANY_SOURCE, hbmcoll.ANY_TAG, status=st)
            wrong += st.source != other or st.tag != rounds % 7 or st.nbytes != 64 or (got != rounds * 2.0 + other).any()
    rounds += 1
print(f"rounds {rounds} wrong {wrong}", flush=True)
c.close()
"""


def test_a_stranger_cannot_reach_send_recv_across_nodes(emulated_nodes, stranger, tmp_path):
    nodes = emulated_nodes(3)  # node 2: the stranger's
    flag = str(tmp_path / "flag")
    ranks = _job(nodes, 29651, P2P, flag, "strangers-p2p-key-0123456789abcdef")
    hammer = None
    try:
        for p in ranks:
            _line(p, "ready")
        targets = [f"{nodes.addrs[i]}:{q}" for i in range(2) for q in _ports(nodes, i, [])]
        hammer = _hammer(nodes, stranger, targets, "--tagged")
        open(flag + ".go", "w").close()
        seen = _posted(hammer, ranks)
        open(flag + ".stop", "w").close()
        res = netnodes.finish(ranks, 120)
    finally:
        for p in ranks:
            if p.poll() is None:
                netnodes.kill_tree(p.pid)
        said = _stop(hammer) if hammer else ""
    assert f"stranger: {STRANGER_OPS} posted" in seen, (seen, said)
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and " wrong 0" in out and "rounds 0 " not in out, (i, out, err[-2000:], said)
