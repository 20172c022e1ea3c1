"""How the pipelined allreduce across nodes chooses its chunk count (hbmcoll.pipeline.Tuner): from
the times of the first calls of each size, or HBMCOLL_PIPELINE_CHUNKS. The pipeline itself runs
in test_across_nodes.py (across_job.py repeats a size through every candidate)."""
import pytest

import hbmcoll
from hbmcoll import pipeline

MIB = 1 << 20


def _explore(tuner, piece, seconds_of):
    """Calls of one size until the tuner chose: the counts it proposed, in order."""
    proposed = []
    while True:
        m = tuner.pick(piece)
        if piece.bit_length() in tuner.chosen:
            return proposed
        proposed.append(m)
        tuner.took(piece, m, seconds_of(m))


def test_each_candidate_is_tried_in_turn_and_the_fastest_median_kept():
    t = pipeline.Tuner(proposer=True)
    times = {1: [5, 9, 5], 2: [4, 4, 30], 4: [3, 99, 99], 8: [6, 6, 6]}
    it = {m: iter(v) for m, v in times.items()}
    proposed = _explore(t, 8 * MIB, lambda m: next(it[m]))
    assert proposed == list(pipeline.CANDIDATES) * pipeline.TRIES
    assert t.pick(8 * MIB) == 2  # medians 5, 4, 99, 6: one fast call of 4 does not win it
    t.took(8 * MIB, 2, 1000.0)   # after the choice, times no longer move it
    assert t.pick(8 * MIB + 1) == 2  # the same size class


def test_small_pieces_are_not_cut_below_the_minimum():
    t = pipeline.Tuner(proposer=True)
    assert set(_explore(t, 3 * pipeline.MIN_PIECE, lambda m: 1.0)) == {1, 2}
    assert set(_explore(t, pipeline.MIN_PIECE - 1, lambda m: 1.0)) == {1}


def test_only_the_proposer_proposes():
    t = pipeline.Tuner(proposer=False)
    assert t.pick(16 * MIB) == 0
    t.took(16 * MIB, 0, 1.0)
    assert t.pick(16 * MIB) == 0


def test_the_environment_fixes_the_count(monkeypatch):
    monkeypatch.setenv("HBMCOLL_PIPELINE_CHUNKS", "3")
    t = pipeline.Tuner(proposer=True)
    assert [t.pick(s) for s in (MIB, 64 * MIB)] == [3, 3]


@pytest.mark.parametrize("value", ["0", "x", "-2", "256", "1.5"])
def test_a_bad_count_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv("HBMCOLL_PIPELINE_CHUNKS", value)
    with pytest.raises(hbmcoll.ArgumentError, match="HBMCOLL_PIPELINE_CHUNKS=.*from 1 to 255"):
        pipeline.fixed_chunks()
