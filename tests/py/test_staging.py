"""Chunks staged for a peer written with streaming stores (HBMCOLL_STAGE_STREAM_MIN,
libcoll/src/stage_probe.c).

A new communicator measures whether streaming pays on this machine (auto) unless the variable
gives a size; whichever it chose, every collective must give the same results. Here every
staged copy streams (0 B) and none does (off), on real ranks, against NumPy; and what each
communicator reports is what it was told, or one answer for all ranks with the probe's times."""
import os

import pytest

from test_collectives import movement_rank, reductions_rank


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("value", ["0", "off"])
def test_every_collective_with_staging_streamed_or_not(run_ranks, P, value):
    env = {"HBMCOLL_STAGE_STREAM_MIN": value}
    run_ranks(P, reductions_rank, timeout=300, env=env)
    run_ranks(P, movement_rank, timeout=300, env=env)


def staging_rank(comm):
    s = comm.staging
    return (s["streaming_from"] or 0,) + (tuple(u * 1e-6 for u in s["probe_us"]) if s["probe_us"] else (0.0, 0.0))


def test_a_size_given_is_taken_without_a_probe(run_ranks):
    assert run_ranks(2, staging_rank, env={"HBMCOLL_STAGE_STREAM_MIN": "4K"}) == [(4096, 0.0, 0.0)] * 2
    assert run_ranks(2, staging_rank, env={"HBMCOLL_STAGE_STREAM_MIN": "off"}) == [(0, 0.0, 0.0)] * 2
    # from 0 B streams every staged copy; reported as from 1 B (0 means none)
    assert run_ranks(2, staging_rank, env={"HBMCOLL_STAGE_STREAM_MIN": "0"}) == [(1, 0.0, 0.0)] * 2


def test_auto_is_measured_and_rank_0_answers_for_all(run_ranks):
    got = run_ranks(2, staging_rank, env={"HBMCOLL_STAGE_STREAM_MIN": "auto"})
    assert len({g[0] for g in got}) == 1 and got[0][0] in (0, 32 << 10), got
    assert all(g[1] > 0 and g[2] > 0 for g in got), got  # every rank timed its batches
    streams = got[0][1] > 0 and got[0][2] < 0.9 * got[0][1]
    assert streams == (got[0][0] != 0), got  # rank 0 kept streaming only when clearly faster


def test_one_rank_has_nothing_to_measure(run_ranks):
    assert run_ranks(1, staging_rank) == [(0, 0.0, 0.0)]


def test_more_ranks_than_cpus_measure_nothing(run_ranks):
    """Oversubscribed, a probe would time the scheduler: none runs, and nothing streams."""
    n = len(os.sched_getaffinity(0)) + 1
    assert run_ranks(n, staging_rank, env={"HBMCOLL_STAGE_STREAM_MIN": "auto"}) == [(0, 0.0, 0.0)] * n


def disagreeing_rank(comm):
    import os

    import hbmcoll
    rank = comm.rank
    comm.close()
    os.environ["HBMCOLL_STAGE_STREAM_MIN"] = "auto" if rank == 0 else "4K"
    again = hbmcoll.init()
    try:
        return staging_rank(again)
    finally:
        again.close()


def test_rank_0_decides_whether_all_probe(run_ranks):
    """Rank 0 says auto, rank 1 a size: both probe and take rank 0's answer (had rank 1 not
    probed, rank 0 would have waited in the probe's first bcast)."""
    got = run_ranks(2, disagreeing_rank, timeout=60)
    assert got[0][0] == got[1][0] and got[1][1] > 0, got
