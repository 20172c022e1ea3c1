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


HERE = os.path.dirname(os.path.abspath(__file__))
KNL72_SNC4 = os.path.join(HERE, "..", "numa", "fixtures", "knl72-snc4-flat.xml")


def _cli(*args):
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "pymod"))
    return subprocess.run([sys.executable, "-m", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_topo_cli_says_no_hbm():
    out = _cli("hbmcoll.topo")
    assert out.returncode == 0, out.stderr
    assert "no high-bandwidth memory" in out.stdout, out.stdout


def test_topo_cli_prints_the_tree():
    """--tree: every rank's parent and children, as the small collectives use them."""
    import json

    out = _cli("hbmcoll.topo", "--topology", KNL72_SNC4, "--ranks", "72", "--tree", "--json")
    assert out.returncode == 0, out.stderr
    ranks = json.loads(out.stdout)["ranks"]
    assert len(ranks) == 72 and sum(r["parent"] == -1 for r in ranks) == 1
    assert max(len(r["children_pus"]) for r in ranks) <= 8


def test_one_list_of_policy_words():
    """The launcher and the topo CLI take exactly the planner's words, aliases included."""
    from hbmcoll import _core

    words = _core.policy_words()
    assert "quadrant" in words["bind"] and "hbm" in words["memory"]
    for word in words["bind"]:
        out = _cli("hbmcoll.topo", "--topology", KNL72_SNC4, "--ranks", "8", "--bind", word)
        assert out.returncode == 0, (word, out.stderr)
    out = _cli("hbmcoll.run", "-n", "1", "--bind", "quadrant", "--memory", "hbm", "true")
    assert out.returncode == 0, out.stderr
    out = _cli("hbmcoll.run", "-n", "1", "--bind", "socket", "true")
    assert out.returncode == 2 and "'quadrant'" in out.stderr, out.stderr
