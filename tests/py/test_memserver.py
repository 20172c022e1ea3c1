"""Memory servers and RemoteBuffer (hbmcoll/memserver/: server.py, client.py): real servers (python -m
hbmcoll.memserver) on loopback, real clients in other processes, the bridge's libfabric tcp.

- write, read, accumulate and version; NumPy and torch bfloat16; buffers of several chunks;
  a buffer striped over two servers;
- concurrent accumulates from 4 processes lose nothing (int32, exact), while a reader never
  sees a torn mix of two of them;
- refusals: a wrong or missing token, a mismatched shape, a request outside the buffer;
- locks: mutual exclusion under contention; a stopped holder loses the lock when its lease ends;
- a server killed under a reading client: PeerLostError, no hang; SIGTERM stops a server cleanly;
- a server and workers on emulated nodes (network namespaces);
- a small classifier trained async and hybrid (ParameterSharing, sharing_job.py) reaches the
  synchronous accuracy within TOLERANCE;
- hbmcoll-run --memservers: servers beside the job, stopped with it, on one node and across two;
- Keras workers sharing their weights (ParameterSharingCallback, keras_sharing_job.py).
"""
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import hbmcoll

PYMOD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pymod")
TOKEN = "memserver-test-token"
ENV = dict(os.environ, PYTHONPATH=PYMOD, HBMCOLL_TOKEN=TOKEN, FI_PROVIDER="tcp")


def write_token(path, token=TOKEN):
    """A token file as a server wants it: readable by its owner alone. path."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def servers(tmp_path):
    """start(k) -> "host:port,..." of k fresh servers; each is stopped (SIGTERM) afterwards."""
    procs = []
    write_token(tmp_path / "token")

    def start(k=1):
        addrs = []
        for _ in range(k):
            addr = f"127.0.0.1:{_free_port()}"
            p = subprocess.Popen([sys.executable, "-m", "hbmcoll.memserver", "--listen", addr, "--token-file",
                                  str(tmp_path / "token"), "--capacity", "64M"],
                                 stderr=subprocess.PIPE, text=True, env=ENV)
            assert "hbmcoll-memserver: 67108864 bytes" in p.stderr.readline()
            procs.append(p)
            addrs.append(addr)
        return ",".join(addrs)
    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=20) == 0  # stops cleanly on SIGTERM


def _clients(code, n, addrs, **env):
    """n processes running code (with i, n, addrs set); their outputs, each must exit 0."""
    procs = [subprocess.Popen([sys.executable, "-c", f"i, n, addrs = {i}, {n}, {addrs!r}\n" + code],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(ENV, **env))
             for i in range(n)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return [o for o, _ in outs]


def test_the_c_data_path_speaks_memproto():
    """The server's data path (pymod/memserve.c) and the clients' (hbmcoll/memserver/protocol.py) agree on every number."""
    from hbmcoll import _core
    from hbmcoll.memserver import protocol as ms
    got = _core.MemServe.protocol()
    assert got == {"HEAD_BYTES": ms.HEAD_BYTES, "REPLY_BYTES": ms.REPLY.size, "HALF": ms.HALF, "MAGIC": ms.MAGIC,
                   "FIRST": ms.FIRST, "LAST": ms.LAST, "NUMBER": ms.NUMBER, "WRITE": ms.WRITE,
                   "ACCUMULATE": ms.ACCUMULATE, "READ": ms.READ, "HEAD_STRUCT_BYTES": ms.HEAD.size,
                   "COMMIT": ms.COMMIT, "STAGE": ms.STAGE, "PARTIAL_S": ms.PARTIAL_S,
                   "STATUS": (ms.OK, ms.REFUSED, ms.FENCED, ms.DTYPE, ms.DROPPED, ms.NOT_STAGED)}


def test_write_read_accumulate_and_version(servers):
    addrs = servers(1)
    rb = hbmcoll.RemoteBuffer("w", (1000, 700), "float32", servers=addrs, token=TOKEN)
    a = np.arange(700000, dtype=np.float32).reshape(1000, 700)  # 2.8 MB: three chunks
    rb.write(a)
    assert rb.version == 1
    rb.accumulate(np.ones_like(a), alpha=-0.5)
    assert np.array_equal(rb.read(), a - 0.5) and rb.version == 2
    req = rb.iaccumulate(np.full_like(a, 2.0))
    got = rb.iread()
    req.wait()
    assert np.array_equal(got.wait(), a + 1.5)
    import torch
    tb = hbmcoll.RemoteBuffer("t", (3, 5), torch.bfloat16, servers=addrs, token=TOKEN)
    tb.write(torch.arange(15, dtype=torch.bfloat16).reshape(3, 5))
    tb.accumulate(torch.ones(3, 5, dtype=torch.bfloat16), alpha=2)
    assert torch.equal(tb.read(), torch.arange(15, dtype=torch.bfloat16).reshape(3, 5) + 2)


def test_a_buffer_striped_over_two_servers(servers):
    addrs = servers(2)
    rb = hbmcoll.RemoteBuffer("s", (300001,), "float64", servers=addrs, token=TOKEN)
    x = np.random.default_rng(0).random(300001)
    rb.write(x)
    rb.accumulate(x, alpha=1.0)
    assert np.array_equal(rb.read(), 2 * x) and rb.version == 2
    assert [p[2:] for p in rb._parts] == [(0, 150000 * 8), (150000 * 8, 300001 * 8)]


STRIPED_WRITES = r"""
import numpy as np, hbmcoll
rb = hbmcoll.RemoteBuffer("sw", (1 << 18,), "int32", servers=addrs)   # 2 parts of 512 KiB
if i == n - 1:  # the reader: every read is one writer's whole array, never half of each
    for _ in range(150):
        a = rb.read()
        assert (a == a[0]).all(), ("torn read across the servers", np.unique(a))
else:
    for k in range(150):
        rb.write(np.full(1 << 18, 10 * k + i, np.int32))
    with rb.lock(timeout=30):  # a holder's own write takes the lock again (reentrant), no deadlock
        rb.write(np.full(1 << 18, 7, np.int32))
print("done")
"""


def test_writes_striped_over_two_servers_are_never_read_torn(servers):
    """Two writers and a reader of a buffer striped over two servers: a read of part 0, then
    part 1, could see two writes; the writes hold the buffer's lock and the read compares the
    parts' counts of whole writes, again until they agree."""
    outs = _clients(STRIPED_WRITES, 3, servers(2))
    assert all(o.strip() == "done" for o in outs)


ACCUMULATE = r"""
import numpy as np, hbmcoll
rb = hbmcoll.RemoteBuffer("c", (3 << 18,), "int32", servers=addrs)   # 3 MiB: 3 chunks a request
if i == n - 1:  # the reader: every read is one whole state, all elements alike
    seen = 0
    while seen < (n - 1) * 30:
        a = rb.read()
        assert (a == a[0]).all(), ("torn read", np.unique(a))
        seen = int(a[0])
else:
    for _ in range(30):
        rb.accumulate(np.ones(3 << 18, np.int32))
print("done")
"""


def test_concurrent_accumulates_lose_nothing_and_reads_are_whole(servers):
    addrs = servers(1)
    _clients(ACCUMULATE, 5, addrs)
    rb = hbmcoll.RemoteBuffer("c", (3 << 18,), "int32", servers=addrs, token=TOKEN)
    assert (rb.read() == 4 * 30).all() and rb.version == 4 * 30


def test_refusals(servers):
    addrs = servers(1)
    with pytest.raises(PermissionError, match="token does not match"):
        hbmcoll.RemoteBuffer("r", (10,), "float32", servers=addrs, token="a-wrong-token-but-long-enough")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HBMCOLL_TOKEN")}
    code = "import hbmcoll\ntry:\n hbmcoll.RemoteBuffer('r', (10,), servers=%r)\nexcept PermissionError as e:\n print(e)" % addrs
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=PYMOD), capture_output=True, text=True)
    assert "no token: pass token= or set HBMCOLL_TOKEN" in out.stdout, out
    rb = hbmcoll.RemoteBuffer("r", (10,), "float32", servers=addrs, token=TOKEN)
    with pytest.raises(hbmcoll.MismatchError, match=r"exists with shape \(10,\) and dtype float32, not \(11,\)"):
        hbmcoll.RemoteBuffer("r", (11,), "float32", servers=addrs, token=TOKEN)
    with pytest.raises(hbmcoll.MismatchError):
        hbmcoll.RemoteBuffer("r", (10,), "int32", servers=addrs, token=TOKEN)
    conn, bid = rb._parts[0][:2]
    with pytest.raises(hbmcoll.ArgumentError, match="refused the request"):
        conn.request(3, bid, 36, 8, dst=np.empty(8, np.uint8))  # bytes 36..44 of a 40-byte buffer
    with pytest.raises(hbmcoll.ArgumentError, match="refused the request"):
        conn.request(2, bid, 0, 6, src=np.zeros(6, np.uint8), alpha=1.0)  # 6 bytes of float32
    ri = hbmcoll.RemoteBuffer("ri", (4,), "int32", servers=addrs, token=TOKEN)
    with pytest.raises(hbmcoll.ArgumentError, match="refused the request"):
        ri.accumulate(np.ones(4, np.int32), alpha=0.5)  # int32 takes whole alphas only
    big = hbmcoll.RemoteBuffer("rbig", (1 << 20,), "int32", servers=addrs, token=TOKEN)
    with pytest.raises(hbmcoll.ArgumentError, match="refused the request"):
        big.accumulate(np.ones(1 << 20, np.int32), alpha=0.5)  # 8 chunks, two in flight: the rest refused too
    big.write(np.full(1 << 20, 3, np.int32))            # the buffer is not left held
    assert (big.read() == 3).all() and big.version == 1
    rb.write(np.ones(10, np.float32))                   # still served
    assert np.array_equal(rb.read(), np.ones(10, np.float32)) and ri.version == 0


COUNTER = r"""
import numpy as np, hbmcoll
rb = hbmcoll.RemoteBuffer("k", (1,), "int32", servers=addrs)
for _ in range(15):
    with rb.lock(timeout=60):
        v = rb.read()
        rb.write(v + 1)   # read-modify-write: only a lock keeps the count
print("done")
"""


def test_the_pool_goes_where_the_plan_says_and_the_line_says_where(tmp_path):
    """HBM named by HBMCOLL_HBM_NODES (this host has none): the pool lands there and the server's
    line says so; --memory ddr keeps it in DDR; --memory hbm on a node without HBM is refused in
    one line. (The QEMU guests check the pages of the same allocation in each KNL mode.)"""
    write_token(tmp_path / "token")
    argv = [sys.executable, "-m", "hbmcoll.memserver", "--token-file", str(tmp_path / "token"), "--capacity", "4M"]
    for extra, memory, want in [({"HBMCOLL_HBM_NODES": "0"}, "auto", "pool in HBM (node 0)"),
                                ({"HBMCOLL_HBM_NODES": "0"}, "ddr", "pool in DDR (node 0)"),
                                ({}, "auto", "pool in DDR (node 0): no HBM")]:
        env = dict(ENV, HBMCOLL_QUIET="1", **extra)
        p = subprocess.Popen(argv + ["--listen", f"127.0.0.1:{_free_port()}", "--memory", memory],
                             stderr=subprocess.PIPE, text=True, env=env)
        line = p.stderr.readline()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0 and want in line, line
    p = subprocess.run(argv + ["--listen", f"127.0.0.1:{_free_port()}", "--memory", "hbm"], capture_output=True,
                       text=True, env=ENV, timeout=60)
    assert p.returncode != 0 and p.stderr.count("\n") == 1 and "--memory hbm: no HBM" in p.stderr, p.stderr


def test_the_lock_excludes_under_contention(servers):
    addrs = servers(1)
    hbmcoll.RemoteBuffer("k", (1,), "int32", servers=addrs, token=TOKEN).write(np.zeros(1, np.int32))
    _clients(COUNTER, 3, addrs)
    assert hbmcoll.RemoteBuffer("k", (1,), "int32", servers=addrs, token=TOKEN).read()[0] == 45


def test_a_stopped_holder_loses_the_lock_when_its_lease_ends(servers):
    addrs = servers(1)
    code = ("import hbmcoll, time\nrb = hbmcoll.RemoteBuffer('l', (1,), servers=%r)\n"
            "rb.lock(lease=1.5).__enter__()\nprint('held', flush=True)\ntime.sleep(60)") % addrs
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGSTOP)  # alive, connected, and holding
        rb = hbmcoll.RemoteBuffer("l", (1,), servers=addrs, token=TOKEN)
        with pytest.raises(hbmcoll.TimeoutError):
            with rb.lock(timeout=0.3):
                pass
        t0 = time.monotonic()
        with rb.lock(timeout=10):
            waited = time.monotonic() - t0
        assert waited < 5, waited
    finally:
        holder.kill()
        holder.wait()


def test_a_server_killed_under_a_reading_client_is_peer_lost(servers):
    addrs = servers(1)
    code = ("import hbmcoll, time\nrb = hbmcoll.RemoteBuffer('d', (1 << 20,), servers=%r)\nprint('up', flush=True)\n"
            "try:\n while True: rb.read()\nexcept hbmcoll.PeerLostError as e:\n print('lost:', e)") % addrs
    client = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=ENV)
    assert client.stdout.readline().strip() == "up"
    time.sleep(0.5)
    pid = None
    for line in subprocess.run(["pgrep", "-f", f"hbmcoll.memserver --listen {addrs}"], capture_output=True,
                               text=True).stdout.split():
        pid = int(line)
    os.kill(pid, signal.SIGKILL)
    out, _ = client.communicate(timeout=60)
    assert client.returncode == 0 and "lost:" in out and "memory server" in out, out


def test_servers_and_workers_on_emulated_nodes(emulated_nodes, tmp_path):
    """A server on node 0, workers on nodes 1 and 2 (network namespaces on a bridge): the bridge
    runs on their veth interface, not loopback; accumulates from both stay exact."""
    import netnodes
    nodes = emulated_nodes(3)
    write_token(tmp_path / "token")
    server = nodes.popen(0, [sys.executable, "-m", "hbmcoll.memserver", "--listen", "10.77.0.1:29990",
                             "--token-file", str(tmp_path / "token"), "--capacity", "16M"],
                         stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        line = server.stderr.readline()
        assert "at 10.77.0.1:29990" in line and "interface hbnet0" in line, line
        code = ("import numpy as np, hbmcoll\nrb = hbmcoll.RemoteBuffer('n', (1 << 20,), 'int32')\n"
                "for _ in range(20): rb.accumulate(np.ones(1 << 20, np.int32))\nprint('done')")
        workers = [nodes.popen(k, [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=dict(ENV, HBMCOLL_MEMSERVERS="10.77.0.1:29990")) for k in (1, 2)]
        for rc, out, err in netnodes.finish(workers, 120):
            assert rc == 0 and "done" in out, err[-2000:]
        check = ("import numpy as np, hbmcoll\nrb = hbmcoll.RemoteBuffer('n', (1 << 20,), 'int32')\n"
                 "a = rb.read(); print(int(a.min()), int(a.max()), rb.version)")
        (rc, out, err), = netnodes.finish([nodes.popen(1, [sys.executable, "-c", check],
                                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                                       env=dict(ENV, HBMCOLL_MEMSERVERS="10.77.0.1:29990"))], 60)
        assert rc == 0 and out.split() == ["40", "40", "40"], (out, err[-2000:])
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0


def _sync_accuracy():
    """The same classifier trained synchronously: batches of 4 x 32, the same epochs (sharing_job)."""
    import torch
    import sharing_job as job
    x, y = job.data()
    net = job.model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for _ in range(4):
        for b in range(0, 4000, 128):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x[b:b + 128]), y[b:b + 128]).backward()
            opt.step()
    return job.accuracy(net, x, y)


TOLERANCE = 0.02  # async and hybrid may end this far below synchronous training, no further


@pytest.mark.parametrize("mode", ["async", "hybrid"])
def test_training_through_the_servers_reaches_the_synchronous_accuracy(servers, mode):
    pytest.importorskip("torch")
    addrs = servers(1)
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharing_job.py")
    env = dict(ENV, HBMCOLL_MEMSERVERS=addrs, OMP_NUM_THREADS="1")
    if mode == "async":  # 4 workers, at most one step apart
        argvs = [[sys.executable, job, "async", str(s), "4"] for s in range(4)]
        env["STALENESS"] = "1"
    else:                # 2 groups of 2 ranks (hbmcoll-run jobs): allreduce inside, async between
        argvs = [[sys.executable, "-m", "hbmcoll.run", "-n", "2", sys.executable, job, "hybrid", str(s), "2"]
                 for s in range(2)]
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for a in argvs]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    got = [float(line.split()[1]) for out, _ in outs for line in out.splitlines() if line.startswith("accuracy")]
    assert len(got) == 4, outs
    assert len(set(got)) == 1, got  # finish() leaves every worker on the same model
    sync = _sync_accuracy()
    assert min(got) >= sync - TOLERANCE, (mode, got, sync)


def test_workers_joining_never_lose_a_running_workers_steps(servers):
    """A worker taking its step counter while another counts its steps: no count is lost (a join
    once rewrote the whole counter array, and a staleness-bounded job hung on the lost steps)."""
    import threading
    from hbmcoll.memserver.param_sharing import SharedParameters
    addrs = servers(1)
    first = SharedParameters(4, servers=addrs, token=TOKEN, name="join", staleness=10 ** 6, timeout=60)
    first.start(np.zeros(4, np.float32))
    done, joins = [0], threading.Event()

    def count():
        while not joins.is_set() or done[0] < 100:
            first._count(1)
            done[0] += 1
    counting = threading.Thread(target=count)
    counting.start()
    joined = [SharedParameters(4, servers=addrs, token=TOKEN, name="join", staleness=10 ** 6, timeout=60)
              for _ in range(8)]
    for j in joined:
        j.start(np.zeros(4, np.float32))
    joins.set()
    counting.join()
    counts = first.iters.read()
    assert counts[0] == 9 and sorted(j.slot for j in joined) == list(range(2, 10))
    assert counts[first.slot] == done[0]


def test_the_overlapped_exchange_loses_no_step_and_takes_in_the_others(servers):
    """Two workers whose every step adds 1 to each parameter, exchanging in the background
    (begin / ready / merge): at the end the shared parameters hold every step of both, and each
    worker saw the other's steps arrive while it went on."""
    from hbmcoll.memserver.param_sharing import SharedParameters
    addrs = servers(1)
    workers = [SharedParameters(1000, servers=addrs, token=TOKEN, name="overlap", timeout=60) for _ in range(2)]
    flats = [np.zeros(1000, np.float32) for _ in range(2)]
    for w, f in zip(workers, flats):
        w.start(f)
    merged = [0, 0]
    for _ in range(60):
        for k, (w, f) in enumerate(zip(workers, flats)):
            f += 1  # this worker's optimizer step
            time.sleep(0.002)  # and its compute, which the exchange overlaps
            if w.ready():
                merged[k] += w.merge(f)
                w.begin(f)
    assert all(m > 0 for m in merged) and all((f > 60).all() for f in flats), (merged, [f.min() for f in flats])
    # finish() waits for the other worker, so the two finish at once; both end on the servers' sum
    import threading
    ends = [threading.Thread(target=w.finish, args=(f,), kwargs={"overlapped": True}) for w, f in zip(workers, flats)]
    for t in ends:
        t.start()
    for t in ends:
        t.join(90)
    assert (workers[0].buffer.read() == 120).all()
    assert all((f == 120).all() for f in flats), [f.min() for f in flats]


RUN_JOB = r"""
import os, numpy as np, hbmcoll
c = hbmcoll.init()
rb = hbmcoll.RemoteBuffer("x", (100001,), "float64")
rb.accumulate(np.ones(100001))
c.barrier()
a = rb.read()
os.write(1, f"got {c.rank} {a.min()} {a.max()} {os.environ['HBMCOLL_MEMSERVERS']}\n".encode())  # one write
"""


def test_hbmcoll_run_starts_servers_beside_the_job():
    env = {k: v for k, v in ENV.items() if not k.startswith("HBMCOLL_TOKEN")}
    p = subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", "2", "--memservers", "2", "--memserver-capacity",
                        "8M", sys.executable, "-c", RUN_JOB], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [line.split() for line in p.stdout.splitlines() if line.startswith("got")]
    assert sorted(w[1] for w in lines) == ["0", "1"] and all(w[2:4] == ["2.0", "2.0"] for w in lines), p.stdout
    assert p.stderr.count("hbmcoll-memserver: 8388608 bytes") == 2, p.stderr
    for addr in lines[0][4].split(","):  # stopped with the job
        host, port = addr.rsplit(":", 1)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=5).close()


def test_servers_beside_the_job_that_log_before_their_ready_line(monkeypatch):
    # libfabric's logs (FI_LOG_LEVEL) come before the server's ready line, and go on while it runs:
    # they are passed on, the servers start, and nothing blocks on a full pipe
    from hbmcoll.memserver import server
    env = {k: v for k, v in ENV.items() if not k.startswith("HBMCOLL_TOKEN")}
    code = ("import hbmcoll.memserver.server as s, sys\n"
            "procs, addrs, stop = s.start_beside(2, '127.0.0.1', [0, 0], 'x' * 32, '4M')\n"
            "print('ready', addrs, flush=True); stop()")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(env, FI_LOG_LEVEL="info"))
    assert p.returncode == 0 and p.stdout.startswith("ready 127.0.0.1:"), p.stdout + p.stderr[-3000:]
    assert "libfabric:" in p.stderr and p.stderr.count("hbmcoll-memserver: 4194304 bytes") == 2, p.stderr[-3000:]
    monkeypatch.setattr(server, "READY_S", 0.5)  # a server that never says it is ready: refused in time
    with pytest.raises(SystemExit, match="no ready line in 0.5 s"):
        _never_ready(server)


def _never_ready(server):
    """A child that writes a line and then nothing, read as start_beside reads a server."""
    p = subprocess.Popen([sys.executable, "-c", "import sys, time; print('a warning', file=sys.stderr, flush=True); "
                          "time.sleep(30)"], stderr=subprocess.PIPE, text=True)
    try:
        reader = server._Stderr(p)
        reader.start()
        reader.ready_line("127.0.0.1:1")
    finally:
        p.kill()
        p.wait()


def test_hbmcoll_run_servers_across_nodes(emulated_nodes):
    import netnodes
    nodes = emulated_nodes(2)
    env = dict({k: v for k, v in ENV.items() if not k.startswith("HBMCOLL_TOKEN")}, HBMCOLL_JOB_KEY="m" * 32)
    procs = [nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "1", "--nnodes", "2", "--node-rank", str(i),
                             "--master", "10.77.0.1:29700", "--memservers", "1", "--memserver-capacity", "8M",
                             sys.executable, "-c", RUN_JOB], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env) for i in range(2)]
    for rc, out, err in netnodes.finish(procs, 120):  # node 1 reaches node 0's server with the derived token
        assert rc == 0 and " 2.0 2.0 10.77.0.1:29764" in out, (out, err[-3000:])


def test_keras_workers_share_through_the_servers(servers):
    pytest.importorskip("tensorflow")
    addrs = servers(1)
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keras_sharing_job.py")
    env = dict(ENV, HBMCOLL_MEMSERVERS=addrs, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
    procs = [subprocess.Popen([sys.executable, job, str(s), "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for s in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "keras accuracy" in out, err[-3000:]
    got = [out.split() for out, _ in outs]
    assert all(float(w[2]) >= 0.9 for w in got), got  # a separable set: both workers' pushes made it
    rb = hbmcoll.RemoteBuffer("keras", (10 * 8 + 8 + 8 * 2 + 2,), "float32", servers=addrs, token=TOKEN)
    assert rb.version == 1 + sum(int(w[4]) for w in got)  # the first weights, then every batch of both
