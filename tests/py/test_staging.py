"""Chunks staged for a peer written with streaming stores (HBMCOLL_STAGE_STREAM_MIN,
libcoll/src/stage_probe.c).

A new communicator measures whether streaming pays on this machine (auto) unless the variable
gives a size; whichever it chose, every collective must give the same results. Here every
staged copy streams (0 B) and none does (off), on real ranks, against NumPy; and what each
communicator reports is what it was told, or one answer for all ranks with the probe's times."""
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


def test_auto_is_measured_and_rank_0_answers_for_all(run_ranks):
    got = run_ranks(3, staging_rank, env={"HBMCOLL_STAGE_STREAM_MIN": "auto"})
    assert len({g[0] for g in got}) == 1 and got[0][0] in (0, 32 << 10), got
    assert all(g[1] > 0 and g[2] > 0 for g in got), got  # every rank timed its batches
    streams = got[0][1] > 0 and got[0][2] < 0.9 * got[0][1]
    assert streams == (got[0][0] != 0), got  # rank 0 kept streaming only when clearly faster


def test_one_rank_has_nothing_to_measure(run_ranks):
    assert run_ranks(1, staging_rank) == [(0, 0.0, 0.0)]
