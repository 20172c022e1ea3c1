"""Point-to-point messages: send/recv/isend/irecv/sendrecv between ranks of one node (in C through
the shared segment, libcoll/src/p2p*.c), against what each rank knows it should get; tags,
ANY_SOURCE, sizes, the irecv-send-wait pattern, a dead sender, misuse. Across nodes (libfabric
tagged messages): test_across_nodes.py, and a stranger in test_strangers.py."""
import signal
import time

import numpy as np
import pytest

import hbmcoll


def _ring(comm, kind):
    r, n = comm.rank, comm.size
    if kind == "numpy":
        mine, got = np.arange(1000, dtype=np.float64) + r, np.empty(1000)
    elif kind == "bytearray":
        mine, got = bytearray([r] * 333), bytearray(333)
    else:
        import torch
        mine, got = torch.full((77,), r, dtype=torch.bfloat16), torch.empty(77, dtype=torch.bfloat16)
    status = hbmcoll.Status()
    comm.sendrecv(mine, (r + 1) % n, got, (r - 1) % n, sendtag=r, status=status)
    left = (r - 1) % n
    if kind == "numpy":
        ok = (got == np.arange(1000) + left).all()
    elif kind == "bytearray":
        ok = got == bytearray([left] * 333)
    else:
        ok = bool((got == left).all())
    return bool(ok), (status.source, status.tag, status.nbytes)


@pytest.mark.parametrize("P", [2, 3, 4])
@pytest.mark.parametrize("kind", ["numpy", "bytearray", "torch"])
def test_a_ring_of_sendrecv(run_ranks, P, kind):
    if kind == "torch":
        pytest.importorskip("torch")
    sizes = {"numpy": 8000, "bytearray": 333, "torch": 154}
    for r, (ok, status) in enumerate(run_ranks(P, _ring, kind)):
        assert ok and status == ((r - 1) % P, (r - 1) % P, sizes[kind])


def _tags_and_sizes(comm):
    big = np.arange(2 << 20, dtype=np.float32)  # 8 MiB: beyond any socket buffer
    if comm.rank == 0:
        reqs = [comm.isend(big * k, 1, tag=k) for k in range(3)]
        comm.send(np.array([7.0]), 1, tag=11)
        comm.send(np.arange(3.0), 1, tag=12)
        for q in reqs:
            q.wait()
        return None
    outs = {k: np.empty_like(big) for k in range(3)}
    reqs = [comm.irecv(outs[k], 0, tag=k) for k in (2, 0, 1)]  # posted out of order: tags decide
    status = hbmcoll.Status()
    small = np.zeros(5)
    comm.recv(small, tag=12, status=status)  # any source, shorter than the buffer
    one = np.empty(1)
    comm.recv(one)  # any source, any tag: the first message left, tag 11
    for q in reqs:
        q.wait()
    return ([bool((outs[k] == big * k).all()) for k in range(3)], small.tolist(), one.tolist(),
            (status.source, status.tag, status.nbytes))


def test_tags_pick_the_message_and_a_short_one_fills_the_front(run_ranks):
    _, got = run_ranks(2, _tags_and_sizes)
    assert got == ([True, True, True], [0.0, 1.0, 2.0, 0.0, 0.0], [7.0], (0, 12, 24))


def _too_long(comm):
    if comm.rank == 0:
        comm.send(np.arange(10.0), 1)
        comm.send(np.array([5.0]), 1)
        return None
    try:
        comm.recv(np.empty(4), 0)
    except hbmcoll.MismatchError as exc:
        said = str(exc)
    after = comm.recv(np.empty(1), 0)  # the stream stays whole: the next message is intact
    return said, after.tolist()


def test_a_message_longer_than_the_buffer_is_a_mismatch(run_ranks):
    said, after = run_ranks(2, _too_long)[1]
    assert "80 bytes" in said and "32" in said and after == [5.0]


def _swap_large(comm):
    """Both post irecv, then a blocking send of 16 MiB, then wait: MPI's pattern that must not
    deadlock (the sends fill the sockets; the receiving thread drains them)."""
    other = 1 - comm.rank
    mine, got = np.full(4 << 20, comm.rank, np.float32), np.empty(4 << 20, np.float32)
    req = comm.irecv(got, other)
    comm.send(mine, other)
    req.wait()
    return bool((got == other).all())


def test_irecv_then_send_then_wait_never_deadlocks(run_ranks):
    assert run_ranks(2, _swap_large) == [True, True]


def _dead_sender(comm):
    import ranks
    if comm.rank == 0:
        ranks.event("sleeping")
        time.sleep(60)  # killed here
    ranks.event("waiting")
    t = time.monotonic()
    try:
        comm.recv(np.empty(1), 0)
    except hbmcoll.PeerLostError as exc:
        return str(exc), time.monotonic() - t
    return "no error", 0


def test_a_receive_from_a_rank_that_was_killed_is_peer_lost(start_ranks):
    job = start_ranks(2, _dead_sender, timeout=60)
    job.wait_event(0, "sleeping")
    job.wait_event(1, "waiting")
    time.sleep(0.5)
    job.signal(0, signal.SIGKILL)
    results = job.join()
    assert results[1].status == "ok", job.report()
    said, took = results[1].value
    assert "rank 0 is gone" in said and took < 15, said  # well before HBMCOLL_TIMEOUT (20 s)


def _misuse(comm):
    said = []
    for call in (lambda: comm.send(np.zeros(1), comm.size), lambda: comm.send(np.zeros(1), 0, tag=-2),
                 lambda: comm.recv(np.zeros(1), -5), lambda: comm.recv(np.zeros(4)[::2], 0),
                 lambda: comm.recv(b"read-only", 0)):
        try:
            call()
            said.append(None)
        except hbmcoll.ArgumentError as exc:
            said.append(type(exc).__name__)
    req = comm.irecv(np.zeros(1), 1 - comm.rank, tag=3)
    try:
        req.wait(timeout=0.3)
    except hbmcoll.TimeoutError:
        said.append("TimeoutError")
    return said


def test_misuse_is_refused_before_anything_travels(run_ranks):
    for said in run_ranks(2, _misuse):
        assert said == ["ArgumentError"] * 5 + ["TimeoutError"]


def _isend_barrier_wait(comm, n):
    """isend, then a collective, then wait, against recv then the collective: the send must move
    while its rank is in the barrier (through the cells, only its helper thread can push it)."""
    if comm.rank == 0:
        req = comm.isend(np.arange(n, dtype=np.uint8) * 3, 1, tag=4)
        comm.barrier()
        req.wait()
        return None
    got = np.empty(n, np.uint8)
    comm.recv(got, 0, tag=4)
    comm.barrier()
    return bool((got == np.arange(n, dtype=np.uint8) * 3).all())


@pytest.mark.parametrize("cma", ["0", "1"])
@pytest.mark.parametrize("n", [100, 16 << 20])
def test_isend_then_barrier_then_wait_against_recv_then_barrier(run_ranks, n, cma):
    assert run_ranks(2, _isend_barrier_wait, n, env={"HBMCOLL_P2P_CMA": cma}, timeout=40)[1] is True


def _threads(comm):
    """Rank 0: a thread blocked in recv(source=1) while the main thread sends to rank 1, whose
    answer that thread receives. One lock held across the recv's wait would deadlock it."""
    import threading
    if comm.rank == 1:
        got = np.empty(4)
        comm.recv(got, 0, tag=1)
        comm.send(got * 2, 0, tag=2)
        return None
    out, errors = np.zeros(4), []

    def receive():
        try:
            comm.recv(out, source=1, tag=2)
        except BaseException as exc:  # seen by the main thread
            errors.append(repr(exc))

    t = threading.Thread(target=receive)
    t.start()
    time.sleep(0.3)  # the thread is in its recv now
    comm.send(np.arange(4.0), 1, tag=1)
    t.join(20)
    return (not t.is_alive()), errors, out.tolist()


def test_a_thread_in_recv_does_not_block_a_send_from_another(run_ranks):
    assert run_ranks(2, _threads, timeout=40)[0] == (True, [], [0.0, 2.0, 4.0, 6.0])


def _dropped_send(comm):
    """Rank 0 drops an unfinished 16 MiB isend (its buffer goes with it) while rank 1, which
    never made a point-to-point call, sits outside the library: Ctrl-C must end the wait, the
    send is withdrawn, and the communicator goes on."""
    import ranks
    if comm.rank == 1:
        ranks.event("elsewhere")
        comm.barrier()  # rank 0 comes once Ctrl-C has ended its wait
        req = comm.irecv(np.empty(4 << 20, np.float32), 0, tag=5)
        try:
            req.wait(timeout=0.5)
            return "the withdrawn message came"
        except hbmcoll.TimeoutError:
            return "nothing came"
    req = comm.isend(np.ones(4 << 20, np.float32), 1, tag=5)
    ranks.event("dropping")
    interrupted = False
    try:
        del req  # waits for the send, as its buffer is in use
        for _ in range(200):
            time.sleep(0.05)
    except KeyboardInterrupt:
        interrupted = True
    comm.barrier()
    return interrupted


def test_a_dropped_unfinished_send_honours_ctrl_c(start_ranks):
    job = start_ranks(2, _dropped_send, timeout=60)
    job.wait_event(1, "elsewhere")
    job.wait_event(0, "dropping")
    time.sleep(0.5)
    job.signal(0, signal.SIGINT)
    results = job.join()
    assert [r.status for r in results] == ["ok", "ok"], job.report()
    assert [r.value for r in results] == [True, "nothing came"]


def test_p2p_cells_is_a_number_of_cells(monkeypatch):
    monkeypatch.setenv("HBMCOLL_P2P_CELLS", "1")
    with pytest.raises(hbmcoll.ArgumentError) as exc:
        hbmcoll._core.env_check()
    assert "HBMCOLL_P2P_CELLS" in str(exc.value) and "number of cells" in str(exc.value)
    assert "byte count" not in str(exc.value)
