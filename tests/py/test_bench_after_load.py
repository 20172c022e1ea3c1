"""bench/after_load.py's rule: an hbmcoll cell is an outlier only when it slowed past the threshold
after the burst and no peer's cell of the same collective and size did (the machine itself slowed)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import after_load  # noqa: E402


def test_outliers_are_hbmcoll_cells_that_slowed_alone():
    quiet = {("hbmcoll-numpy", 2, "bcast", 8): 1.0, ("mpi4py", 2, "bcast", 8): 1.0,
             ("hbmcoll-numpy", 2, "bcast", 65536): 10.0, ("mpi4py", 2, "bcast", 65536): 10.0,
             ("hbmcoll-empty", 2, "bcast", 65536): 5.0, ("openmpi", 2, "bcast", 65536): 9.0,
             ("hbmcoll-numpy", 2, "gather", 8): 1.0}
    after = {("hbmcoll-numpy", 2, "bcast", 8): 3.0, ("mpi4py", 2, "bcast", 8): 1.1,     # alone: outlier
             ("hbmcoll-numpy", 2, "bcast", 65536): 20.0, ("mpi4py", 2, "bcast", 65536): 18.0,  # all slowed
             ("hbmcoll-empty", 2, "bcast", 65536): 7.4, ("openmpi", 2, "bcast", 65536): 9.0,   # under 1.5x
             ("hbmcoll-numpy", 2, "gather", 8): 9.0}                                          # no peer: unknown
    moved, found = after_load.outliers(quiet, after, 1.5)
    assert [(f[0], f[2], f[3]) for f in found] == [("hbmcoll-numpy", "bcast", 8)]
    assert abs(found[0][4] - 3.0) < 1e-9 and abs(found[0][5] - 1.1) < 1e-9
    assert abs(moved[("hbmcoll-empty", 2, "bcast", 65536)] - 1.48) < 1e-9
    md = after_load.table(quiet, after, moved, found, 1.5)
    assert "Outliers (hbmcoll after / quiet over 1.5x while every peer stayed within it): 1" in md
    assert "- hbmcoll-numpy P=2 bcast 8 B: 3.00x (peers at most 1.10x)" in md
