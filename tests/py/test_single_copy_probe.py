"""A large gather's single copy chosen by measurement (HBMCOLL_CMA=auto, the default;
libcoll/src/cma_probe.c).

Where process_vm_writev works between every pair, a new communicator times gathers staged and
single copy; rank 0 keeps single copy unless staging was clearly faster, and every rank takes its
answer. Here: what each communicator reports is one answer for all ranks, consistent with the
probe's times, and its large gathers take the path it reports; no probe where nothing would be
measured or another word was asked for."""
import os

import numpy as np
import pytest

N = 1 << 20  # bytes a rank gathers: above HBMCOLL_CMA_MIN's 256 KiB
CPUS = len(os.sched_getaffinity(0))
CMA_MAX_RANKS = 8  # libcoll's COLL_CMA_MAX_RANKS: beyond, single copy is off
two_cpus = pytest.mark.skipif(CPUS < 2, reason="a probe needs a CPU per rank")


def probe_rank(comm):
    x = np.full(N // 4, comm.rank, np.float32)
    out = comm.gather(x, root=0)
    if comm.rank == 0:
        assert all((out[q] == q).all() for q in range(comm.size))
    probe = comm.single_copy_probe
    return (comm.single_copy, probe and (probe["bytes"], *probe["us"]), comm._c.algorithm)


@two_cpus
def test_auto_measures_and_rank_0_answers_for_all(run_ranks):
    got = run_ranks(2, probe_rank, env={"HBMCOLL_CMA": "auto"})
    assert got[0][0] == got[1][0] and got[0][0] in ((), ("gather",)), got
    assert got[0][1] == got[1][1], got  # rank 0's times, on every rank
    assert all(g[1] and g[1][0] == 1 << 20 and g[1][1] > 0 and g[1][2] > 0 for g in got), got
    kept = not got[0][1][1] < 0.9 * got[0][1][2]  # rank 0's times: single copy unless staging clearly won
    assert kept == (got[0][0] == ("gather",)), got
    assert {g[2] for g in got} == {"single-copy" if kept else "pipelined"}, got


@two_cpus
def test_auto_is_the_default(run_ranks):
    got = run_ranks(2, probe_rank)
    assert all(g[1] for g in got), got


def test_a_word_given_is_taken_without_a_probe(run_ranks):
    assert [g[:2] for g in run_ranks(2, probe_rank, env={"HBMCOLL_CMA": "0"})] == [((), None)] * 2
    assert [g[:2] for g in run_ranks(2, probe_rank, env={"HBMCOLL_CMA": "gather"})] == [(("gather",), None)] * 2


@two_cpus
def test_the_probe_gathers_a_large_message(run_ranks):
    """1 MiB a rank, or from where single copy starts if that is larger: what is kept holds for
    large gathers, whatever HBMCOLL_CMA_MIN is."""
    got = run_ranks(2, probe_rank, env={"HBMCOLL_CMA_MIN": "64K"})
    assert {g[1][0] for g in got} == {1 << 20}, got
    got = run_ranks(2, probe_rank, env={"HBMCOLL_CMA_MIN": "2M"})
    assert {g[1][0] for g in got} == {2 << 20}, got
    # at most 4 MiB a rank is measured; from further up single copy stays without a probe
    got = run_ranks(2, probe_rank, env={"HBMCOLL_CMA_MIN": "8M"})
    assert [g[:2] for g in got] == [(("gather",), None)] * 2, got


def test_more_ranks_than_cpus_keep_single_copy_unmeasured(run_ranks):
    """Oversubscribed, a probe would time the scheduler, and staging needs both ranks on a CPU at
    once where single copy does not: single copy stays."""
    n = CPUS + 1
    if n > CMA_MAX_RANKS:
        pytest.skip(f"{n} ranks: single copy is off beyond {CMA_MAX_RANKS}")
    got = run_ranks(n, probe_rank, env={"HBMCOLL_CMA": "auto"})
    assert [g[:3] for g in got] == [(("gather",), None, "single-copy")] * n, got


def test_one_rank_has_nothing_to_measure(run_ranks):
    assert run_ranks(1, probe_rank)[0][1] is None


def disagreeing_rank(comm, words):
    import hbmcoll
    rank = comm.rank
    comm.close()
    os.environ["HBMCOLL_CMA"] = words[rank]
    again = hbmcoll.init()
    try:
        return probe_rank(again)
    finally:
        again.close()


@two_cpus
def test_rank_0_decides_whether_all_probe(run_ranks):
    """Rank 0 says auto and rank 1 allows single copy (=1): both probe and take rank 0's answer
    (had rank 1 not probed, rank 0 would have waited in the probe's first gather). A rank that
    forbids single copy (=0) turns it off for all, and nobody probes."""
    got = run_ranks(2, disagreeing_rank, ("auto", "1"), timeout=60)
    assert got[0][0] == got[1][0] and got[0][1] and got[1][1], got
    got = run_ranks(2, disagreeing_rank, ("auto", "0"), timeout=60)
    assert [g[:2] for g in got] == [((), None)] * 2, got


def split_rank(comm):
    half = comm.split(comm.rank % 2)
    try:
        return probe_rank(comm)[:2], probe_rank(half)[:2]
    finally:
        half.close()


@two_cpus
def test_a_split_takes_its_parents_measurement(run_ranks):
    got = run_ranks(2, split_rank, env={"HBMCOLL_CMA": "auto"})
    assert [g[1] for g in got] == [g[0] for g in got], got


def arena_gather_rank(comm, n):
    import hbmcoll
    x = np.full(n, comm.rank + 1, np.float32)
    for root in range(comm.size):
        out = hbmcoll.empty((comm.size, n), "float32", comm=comm) if comm.rank == root else None
        got = comm.gather(x, root=root, out=out)
        if comm.rank == root:
            assert all((got[q] == q + 1).all() for q in range(comm.size)), root
    return comm._c.algorithm


@pytest.mark.parametrize("P", [2, 3])
def test_a_gather_into_the_arena_with_single_copy_on(run_ranks, P):
    """The root's output in hbmcoll.empty memory: the others copy into it as shared memory (no
    kernel call), whatever single copy says."""
    got = run_ranks(P, arena_gather_rank, N // 4, env={"HBMCOLL_CMA": "gather"})
    assert got == ["arena"] * P, got
