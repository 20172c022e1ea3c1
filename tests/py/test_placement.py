"""Binding and topology on this machine, seen from inside real ranks."""
import os

import pytest


def placement_rank(comm):
    import hbmcoll

    topo = hbmcoll.topology()
    return sorted(os.sched_getaffinity(0)), comm.pu, topo["memory_mode"], topo["notices"]


def _cpus():
    return sorted(os.sched_getaffinity(0))


def test_one_rank_per_core_when_cores_suffice(run_ranks):
    cpus = _cpus()
    n = min(len(cpus), 4)
    res = run_ranks(n, placement_rank, env={"HBMCOLL_BIND": "core"})
    pinned = [aff for aff, _, _, _ in res]
    assert all(len(a) == 1 for a in pinned), pinned
    assert len({a[0] for a in pinned}) == n, f"two ranks on one core: {pinned}"
    assert [pu for _, pu, _, _ in res] == [a[0] for a in pinned]


def test_oversubscribed_ranks_bound_to_cluster(run_ranks):
    """More ranks than PUs: each rank may run on any PU of its cluster, and it is said."""
    cpus = _cpus()
    if len(cpus) > 4:
        pytest.skip("needs a machine with at most 4 CPUs to oversubscribe cheaply")
    res = run_ranks(2 * len(cpus) + 1, placement_rank, env={"HBMCOLL_BIND": "core"})
    for aff, pu, _, notices in res:
        assert aff == cpus and pu is None, (aff, pu)
        assert any("bound to the cluster" in n for n in notices), notices


def test_no_hbm_here_is_said(run_ranks):
    (aff, pu, mode, notices), = run_ranks(1, placement_rank, env={"HBMCOLL_BIND": "none"})
    assert mode == "none" and pu is None
    assert any("no HBM" in n for n in notices), notices


def test_topo_cli_says_no_hbm():
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "..", "pymod"))
    out = subprocess.run([sys.executable, "-m", "hbmcoll.topo"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "no high-bandwidth memory" in out.stdout, out.stdout
