"""Memory servers' data semantics (issue 30): real servers and clients, stopped with SIGSTOP.

- a striped write stalled past its lease never completes half over another holder's write (5);
- every write and accumulate carries its dtype; every NumPy dtype reads and writes; int64
  accumulates (6);
- locks are fenced: a holder stopped past its lease is refused when it resumes (7);
- a lock/read/increment/write loop over a (1,) buffer striped over two servers (8);
- a writer stopped in the middle of a chunked write blocks no reader (10);
- a client reaches a restarted server, and an old handle says its buffer is gone (11).
"""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hbmcoll
from test_memserver import ENV, TOKEN, _clients, _free_port, servers, write_token  # noqa: F401 (a fixture)


def _client(code, addrs, **env):
    """A client process running code (addrs set), its stdout a pipe of lines."""
    return subprocess.Popen([sys.executable, "-c", f"addrs = {addrs!r}\n" + code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True, env=dict(ENV, **env))


def _stopped(p, timeout=60):
    """Wait until p stopped itself (SIGSTOP)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        with open(f"/proc/{p.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.05)
    raise AssertionError("the client did not stop")


def _finish(p, timeout=60):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"the client hung: {out} {err[-3000:]}")
    assert p.returncode == 0, err[-3000:]
    return out


STALLED_STRIPED = r"""
import os, signal, numpy as np, hbmcoll
rb = hbmcoll.RemoteBuffer("s5", (1 << 16,), "int32", servers=addrs)
rb.write(np.zeros(1 << 16, np.int32))
second = rb._parts[1][0]
run = second.run
def stall(requests):  # this process stops itself between the parts of its write
    requests = list(requests)
    if requests and requests[0][0] == 1 and not getattr(second, "stalled", False):
        second.stalled = True
        print("stalled", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return run(requests)
second.run = stall
try:
    with rb.lock(timeout=30, lease=1.5):
        rb.write(np.full(1 << 16, 1, np.int32))
    print("wrote")
except hbmcoll.Error as e:
    print("refused:", e)
"""


def test_5_a_striped_write_stalled_past_its_lease_never_mixes(servers):
    """Writer A stops itself between the parts of a striped write, past its lease; B takes the
    lock and writes the whole buffer; A resumes: its later part is refused (fenced), and every
    read is B's write whole, never A's part 0 with B's part 1."""
    addrs = servers(2)
    a = _client(STALLED_STRIPED, addrs)
    try:
        assert a.stdout.readline().strip() == "stalled"
        _stopped(a)
        rb = hbmcoll.RemoteBuffer("s5", (1 << 16,), "int32", servers=addrs, token=TOKEN)
        with rb.lock(timeout=30):  # granted once A's lease ran out
            rb.write(np.full(1 << 16, 2, np.int32))
        a.send_signal(signal.SIGCONT)
        out = _finish(a)
        got = rb.read()
        assert (got == got[0]).all(), ("a read mixed two writes", np.unique(got))
        assert "refused:" in out and "lease" in out, out
        assert (got == 2).all()
    finally:
        a.kill()
        a.wait()


def test_6_writes_and_accumulates_carry_their_dtype(servers):
    addrs = servers(1)
    rb = hbmcoll.RemoteBuffer("f", (8,), "float32", servers=addrs, token=TOKEN)
    for bad in (np.ones(8, np.int32), np.ones(4, np.float64)):
        with pytest.raises(hbmcoll.MismatchError, match=f"float32.*{bad.dtype}|{bad.dtype}.*float32"):
            rb.write(bad)
        with pytest.raises(hbmcoll.MismatchError, match="float32"):
            rb.accumulate(bad)
    torch = pytest.importorskip("torch")
    half = hbmcoll.RemoteBuffer("h", (8,), "float16", servers=addrs, token=TOKEN)
    with pytest.raises(hbmcoll.MismatchError, match="bfloat16"):
        half.write(torch.ones(8, dtype=torch.bfloat16))
    assert rb.version == 0 and half.version == 0  # nothing reinterpreted
    conn, bid = rb._parts[0][:2]  # a raw request naming int32 for the float32 buffer: the server refuses it too
    from hbmcoll.memserver import protocol as ms
    with pytest.raises(hbmcoll.ArgumentError, match="dtype"):
        conn.request(ms.WRITE, bid, 0, 32, src=np.ones(8, np.int32).view(np.uint8), dtype=ms.dtype_code("int32"))
    assert rb.version == 0


@pytest.mark.parametrize("dtype", ["int64", "uint8", "int8", "int16", "uint16", "uint32", "uint64", "bool",
                                   "complex64", "complex128"])
def test_6_every_numpy_dtype_reads_and_writes(servers, dtype):
    addrs = servers(2)
    rb = hbmcoll.RemoteBuffer("d", (5, 3), dtype, servers=addrs, token=TOKEN)
    a = (np.arange(15).reshape(5, 3) * 7 + 1).astype(dtype)
    rb.write(a)
    got = rb.read()
    assert got.dtype == np.dtype(dtype) and np.array_equal(got, a)


def test_6_int64_accumulates_with_whole_alphas(servers):
    addrs = servers(1)
    rb = hbmcoll.RemoteBuffer("i64", (4,), "int64", servers=addrs, token=TOKEN)
    big = np.array([1 << 40, -(1 << 40), 3, 0], np.int64)
    rb.write(big)
    rb.accumulate(np.array([1, 2, 3, 1 << 41], np.int64), alpha=-2)
    assert np.array_equal(rb.read(), big - 2 * np.array([1, 2, 3, 1 << 41], np.int64))
    with pytest.raises(hbmcoll.ArgumentError, match="refused the request"):
        rb.accumulate(np.ones(4, np.int64), alpha=0.5)
    u8 = hbmcoll.RemoteBuffer("u8", (4,), "uint8", servers=addrs, token=TOKEN)
    with pytest.raises(hbmcoll.ArgumentError, match="uint8"):
        u8.accumulate(np.ones(4, np.uint8))


STALE_HOLDER = r"""
import os, signal, numpy as np, hbmcoll
rb = hbmcoll.RemoteBuffer("k7", (1,), "int32", servers=addrs)
lock = rb.lock(timeout=30, lease=1.5)
lock.__enter__()
v = rb.read()
print("read", int(v[0]), flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # past the lease
try:
    rb.write(v + 1)
    print("wrote", flush=True)
except hbmcoll.Error as e:
    print("refused:", e, flush=True)
try:
    lock.__exit__(None, None, None)
except hbmcoll.Error as e:
    print("unlock:", e)
"""


def test_7_a_holder_stopped_past_its_lease_is_fenced(servers):
    """A holds the lock, reads the counter and stops past its lease; B takes the lock and adds
    one; A resumes and writes its stale increment: the server refuses it (fencing token) and A
    hears why at once. One increment stands, and A knows its own did not."""
    addrs = servers(1)
    hbmcoll.RemoteBuffer("k7", (1,), "int32", servers=addrs, token=TOKEN).write(np.zeros(1, np.int32))
    a = _client(STALE_HOLDER, addrs)
    try:
        assert a.stdout.readline().strip() == "read 0"
        _stopped(a)
        rb = hbmcoll.RemoteBuffer("k7", (1,), "int32", servers=addrs, token=TOKEN)
        with rb.lock(timeout=30):
            rb.write(rb.read() + 1)
        a.send_signal(signal.SIGCONT)
        out = _finish(a)
        assert "refused:" in out and "lease" in out and "wrote" not in out, out
        assert rb.read()[0] == 1
    finally:
        a.kill()
        a.wait()


COUNTER = r"""
import numpy as np, hbmcoll
rb = hbmcoll.RemoteBuffer("k8", (1,), dtype, servers=addrs, timeout=20)
for _ in range(10):
    with rb.lock(timeout=60):
        rb.write(rb.read() + 1)
print("done")
"""


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_8_a_counter_striped_over_two_servers(servers, dtype):
    """(1,) over two servers: one part is empty. 4 processes lock, read, add one, write."""
    addrs = servers(2)
    hbmcoll.RemoteBuffer("k8", (1,), dtype, servers=addrs, token=TOKEN).write(np.zeros(1, dtype))
    _clients(f"dtype = {dtype!r}\n" + COUNTER, 4, addrs)
    assert hbmcoll.RemoteBuffer("k8", (1,), dtype, servers=addrs, token=TOKEN).read()[0] == 40


STALLED_CHUNKS = r"""
import os, signal, numpy as np, hbmcoll
rb = hbmcoll.RemoteBuffer("c10", (1 << 20,), "int32", servers=addrs)   # 4 MiB: 8 chunks
rb.write(np.full(1 << 20, 1, np.int32))
conn = rb._parts[0][0]
post, sent = conn._post, [0]
def stall(*a):  # this process stops itself after 3 chunks of its write
    sent[0] += 1
    if sent[0] == 4:
        print("stalled", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return post(*a)
conn._post = stall
try:
    rb.write(np.full(1 << 20, 2, np.int32))
    print("wrote")
except hbmcoll.Error as e:
    print("refused:", e)
"""

READER = r"""
import numpy as np, hbmcoll
a = hbmcoll.RemoteBuffer("c10", (1 << 20,), "int32", servers=addrs).read()  # the default timeout
print(np.unique(a).tolist())
"""


def test_10_a_writer_stopped_mid_write_blocks_no_reader(servers):
    """A writer stops after 3 of its 8 chunks: a reader (default timeout) gets the last whole
    write at once, never the partial bytes; past the server's deadline the partial write is
    dropped and the writer, resumed, hears so."""
    from hbmcoll.memserver import protocol as ms
    addrs = servers(1)
    a = _client(STALLED_CHUNKS, addrs)
    try:
        assert a.stdout.readline().strip() == "stalled"
        _stopped(a)
        time.sleep(0.5)  # its chunks so far have arrived
        assert _finish(_client(READER, addrs), timeout=60).strip() == "[1]"
        time.sleep(ms.PARTIAL_S + 1)
        a.send_signal(signal.SIGCONT)
        out = _finish(a)
        assert "refused:" in out and "dropped" in out, out
        assert _finish(_client(READER, addrs), timeout=60).strip() == "[1]"
    finally:
        a.kill()
        a.wait()


RESTARTED = r"""
import os, sys, numpy as np, hbmcoll
rb = hbmcoll.RemoteBuffer("r11", (4,), "int32", servers=addrs)
rb.write(np.full(4, 5, np.int32))
print("wrote", flush=True)
sys.stdin.readline()  # the server restarts meanwhile
if os.environ["ORDER"] == "new first":  # the idle connection it would reuse is the old server's
    print("new read:", hbmcoll.RemoteBuffer("r11", (4,), "int32", servers=addrs).read().tolist(), flush=True)
for _ in range(2):
    try:
        print("old read:", rb.read().tolist(), flush=True)
    except hbmcoll.Error as e:
        print("old:", type(e).__name__, e, flush=True)
fresh = hbmcoll.RemoteBuffer("r11", (4,), "int32", servers=addrs)
print("new read:", fresh.read().tolist())
fresh.write(np.full(4, 6, np.int32))
print("new read:", fresh.read().tolist())
"""


@pytest.mark.parametrize("order", ["old first", "new first"])
def test_11_a_client_reaches_a_restarted_server(tmp_path, order):
    write_token(tmp_path / "token")
    addr = f"127.0.0.1:{_free_port()}"
    argv = [sys.executable, "-m", "hbmcoll.memserver", "--listen", addr, "--token-file", str(tmp_path / "token"),
            "--capacity", "4M"]
    server = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=ENV)
    client = None
    try:
        assert "bytes for buffers" in server.stderr.readline()
        client = _client(RESTARTED, addr, ORDER=order)
        assert client.stdout.readline().strip() == "wrote"
        server.kill()
        server.wait()
        server = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=ENV)
        assert "bytes for buffers" in server.stderr.readline()
        client.stdin.write("go\n")
        client.stdin.flush()
        out = _finish(client).splitlines()
        if order == "new first":
            assert out.pop(0) == "new read: [0, 0, 0, 0]", out
        assert all(line.startswith("old: PeerLostError") for line in out[:2]), out
        assert "gone" in out[1], out
        assert out[2:] == ["new read: [0, 0, 0, 0]", "new read: [6, 6, 6, 6]"], out
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait()
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0


BETWEEN_COMMITS = r"""
import os, signal, numpy as np, hbmcoll
from hbmcoll.memserver import protocol as ms
rb = hbmcoll.RemoteBuffer("s5c", (1 << 16,), "int32", servers=addrs)
rb.write(np.zeros(1 << 16, np.int32))
second = rb._parts[1][0]
run = second.run
def stall(requests, **kw):  # this process stops itself between part 0's commit and part 1's
    requests = list(requests)
    if requests and requests[0][0] == ms.COMMIT and not getattr(second, "stalled", False):
        second.stalled = True
        print("stalled", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return run(requests, **kw)
second.run = stall
lock = rb.lock(timeout=30, lease=1.5)
lock.__enter__()
rb.write(np.full(1 << 16, 1, np.int32))
print("wrote", flush=True)
try:
    lock.__exit__(None, None, None)
except hbmcoll.Error as e:
    print("unlock:", e)
"""


def test_5_a_striped_write_stopped_between_its_commits_is_read_whole(servers):
    """A commits part 0 of its write and stops before part 1's commit: a read gets A's write
    whole at once (the part still holding it staged commits it), another holder's later write
    stands, and A, resumed, finds its write in and goes on."""
    addrs = servers(2)
    a = _client(BETWEEN_COMMITS, addrs)
    try:
        assert a.stdout.readline().strip() == "stalled"
        _stopped(a)
        rb = hbmcoll.RemoteBuffer("s5c", (1 << 16,), "int32", servers=addrs, token=TOKEN, timeout=20)
        assert (rb.read() == 1).all()
        with rb.lock(timeout=30):
            rb.write(np.full(1 << 16, 2, np.int32))
        a.send_signal(signal.SIGCONT)
        out = _finish(a)
        assert "wrote" in out and "unlock:" in out and "lease ran out" in out, out
        assert (rb.read() == 2).all()
    finally:
        a.kill()
        a.wait()


STALLED_READER = r"""
import os, signal, numpy as np, hbmcoll
rb = hbmcoll.RemoteBuffer("r10", (1 << 20,), "int32", servers=addrs)
conn = rb._parts[0][0]
post, sent = conn._post, [0]
def stall(*a):  # this process stops itself after 3 chunks of its read
    sent[0] += 1
    if sent[0] == 4:
        print("stalled", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return post(*a)
conn._post = stall
print(np.unique(rb.read()).tolist())
"""


def test_10_a_reader_stopped_mid_read_holds_writers_back_only_briefly(servers):
    """A reader stops after 3 of its 8 chunks: a writer's write goes in once the reader's hold
    passed the server's deadline (not for ever); the reader, resumed, reads again and gets the
    new contents whole."""
    addrs = servers(1)
    rb = hbmcoll.RemoteBuffer("r10", (1 << 20,), "int32", servers=addrs, token=TOKEN)
    rb.write(np.full(1 << 20, 1, np.int32))
    a = _client(STALLED_READER, addrs)
    try:
        assert a.stdout.readline().strip() == "stalled"
        _stopped(a)
        rb.write(np.full(1 << 20, 2, np.int32))  # waits at most about PARTIAL_S
        assert (rb.read() == 2).all()
        a.send_signal(signal.SIGCONT)
        assert _finish(a).strip() == "[2]"
    finally:
        a.kill()
        a.wait()


def test_10_a_read_has_a_default_timeout_and_the_connection_is_made_again(servers):
    """A server stopped (SIGSTOP): a read without timeout= ends with TimeoutError (protocol.py's
    DATA_TIMEOUT_S), not never; the server resumed, the same handle reconnects and reads on."""
    from hbmcoll.memserver import protocol as ms
    addrs = servers(1)
    rb = hbmcoll.RemoteBuffer("t10", (16,), "int32", servers=addrs, token=TOKEN)
    rb.write(np.full(16, 4, np.int32))
    pid = int(subprocess.run(["pgrep", "-f", f"hbmcoll.memserver --listen {addrs}"], capture_output=True,
                             text=True).stdout.split()[0])
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(hbmcoll.TimeoutError, match="did not answer"):
            rb.read()
        assert time.monotonic() - t0 < ms.DATA_TIMEOUT_S + 30  # ended (a generous bound)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (rb.read() == 4).all()


def test_12_a_lock_whose_connection_failed_is_lost_not_written_under(servers):
    """The connection that holds the lock fails inside `with rb.lock()` (as when a write times out):
    the server frees the lock at once, another client takes it and writes; the first one's next
    write finds a new connection that holds no lock, and is refused with PeerLostError instead of
    going out unfenced. Leaving the block sends no unlock on the dead connection."""
    addrs = servers(1)
    rb = hbmcoll.RemoteBuffer("k12", (4,), "int32", servers=addrs, token=TOKEN)
    rb.write(np.zeros(4, np.int32))
    other = hbmcoll.RemoteBuffer("k12", (4,), "int32", servers=addrs, token=TOKEN)
    took = []

    def another_thread():  # another holder (a thread: the lock is this thread's, on every handle)
        with other.lock(timeout=10):  # free already: not after the 60 s lease
            other.write(np.full(4, 2, np.int32))
            took.append(True)

    with rb.lock(timeout=30, lease=60):
        rb._parts[0][0].drop()
        t = threading.Thread(target=another_thread)
        t.start()
        t.join(30)
        assert took
        with pytest.raises(hbmcoll.PeerLostError, match="lock went with it"):
            rb.write(np.full(4, 1, np.int32))
        with pytest.raises(hbmcoll.PeerLostError, match="lock went with it"):  # through any handle of it
            other.write(np.full(4, 1, np.int32))
    assert list(rb.read()) == [2, 2, 2, 2]
    with rb.lock(timeout=10):  # taken again on the new connection, fenced as before
        rb.write(np.full(4, 3, np.int32))
    assert list(other.read()) == [3, 3, 3, 3]
