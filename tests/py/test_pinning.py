"""Pinning for compute and communication together (issue 15, defect 15).

The default binding (share) gives each rank its share of its cluster's cores, all of them when it
is alone, and the compute threads follow it; `python -m hbmcoll.topo`, `hbmcoll.topology()` and
what the rank runs on agree. What it costs or saves in a training step is measured by
`bench/ddp_throughput.py --bind ...`, not here (tests never time).
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ranks

PYMOD = Path(__file__).resolve().parents[2] / "pymod"

_REPORT = """
import json, os, sys
import numpy as np
import hbmcoll
c = hbmcoll.init()
threads = None
if "torch" in sys.modules or os.environ.get("WITH_TORCH"):
    import torch
    threads = torch.get_num_threads()
plan = hbmcoll.topology()["ranks"][c.local_rank]
line = json.dumps(dict(rank=c.rank, affinity=sorted(os.sched_getaffinity(0)),
                       omp=os.environ.get("OMP_NUM_THREADS"), torch=threads,
                       cpus=plan["cpus"], plan_threads=plan["threads"]))
os.write(1, (line + chr(10)).encode())  # one write: the ranks share the launcher's stdout
"""


def _run(tmp_path, n, extra_args=(), torch_first=False, **env):
    e = ranks.clean_env({"PYTHONPATH": str(PYMOD), "HBMCOLL_QUIET": "1"})
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        e.pop(var, None)  # the harness pins them to 1; here the plan must choose
    e.update(env)
    prog = tmp_path / "report.py"
    prog.write_text(("import torch\n" if torch_first else "") + _REPORT)
    res = subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", str(n), *extra_args,
                          str(prog)], env=e, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return sorted((json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")),
                  key=lambda r: r["rank"])


def _cpus(text):
    out = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return sorted(out)


def test_lone_rank_keeps_every_core(tmp_path):
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no affinity on this system")
    allowed = sorted(os.sched_getaffinity(0))
    pytest.importorskip("torch")  # torch imported before init(): its pool follows the share
    (r,) = _run(tmp_path, 1, WITH_TORCH="1", torch_first=True)
    assert r["affinity"] == allowed and _cpus(r["cpus"]) == allowed
    assert int(r["omp"]) == r["plan_threads"] == len(allowed) == r["torch"]


def test_ranks_split_the_cores_and_agree_with_the_plan(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    n = max(1, min(len(allowed), 4))
    got = _run(tmp_path, n)
    seen = set()
    for r in got:
        assert r["affinity"] == _cpus(r["cpus"]), r  # the run and topology() agree
        assert int(r["omp"]) == r["plan_threads"] >= 1
        assert not seen & set(r["affinity"])
        seen |= set(r["affinity"])
    assert sorted(seen) == allowed  # no core left idle, none shared


def test_bind_core_and_users_thread_count_are_kept(tmp_path):
    got = _run(tmp_path, 1, ("--bind", "core"), OMP_NUM_THREADS="3")
    assert len(got[0]["affinity"]) == 1 and got[0]["omp"] == "3"


def test_topo_cli_agrees_with_the_launcher(tmp_path):
    n = len(os.sched_getaffinity(0))
    cli = subprocess.run([sys.executable, "-m", "hbmcoll.topo", "--ranks", str(n), "--json"],
                         env=ranks.clean_env({"PYTHONPATH": str(PYMOD)}), capture_output=True,
                         text=True, timeout=60)
    plan = json.loads(cli.stdout)
    got = _run(tmp_path, n)
    assert [r["cpus"] for r in plan["ranks"]] == [r["cpus"] for r in got]
    text = subprocess.run([sys.executable, "-m", "hbmcoll.topo", "--ranks", str(n)],
                          env=ranks.clean_env({"PYTHONPATH": str(PYMOD)}), capture_output=True,
                          text=True, timeout=60).stdout
    assert text.index("cluster 0 (") < text.index("rank 0 ")  # clusters summarised first
