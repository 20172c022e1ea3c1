"""The same user script runs unchanged under hbmcoll-run, torchrun, MPICH's
mpiexec, and with hbmcoll.init(comm=MPI.COMM_WORLD)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "same_script.py")
N = 4


def _env():
    env = dict(os.environ, HBMCOLL_TIMEOUT="30", HBMCOLL_QUIET="1")
    pymod = os.path.join(HERE, "..", "..", "pymod")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(pymod), env.get("PYTHONPATH")]))
    for k in list(env):  # an outer launcher's variables would confuse the inner one
        if k.startswith(("HBMCOLL_RANK", "HBMCOLL_SIZE", "HBMCOLL_LOCAL", "HBMCOLL_JOB_KEY", "PMI_",
                         "OMPI_", "SLURM_")) or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            del env[k]
    return env


def _run(cmd, launcher):
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    lines = re.findall(r"OK rank=(\d+) size=(\d+) launcher=(\S+)", p.stdout)
    assert sorted(int(r) for r, _, _ in lines) == list(range(N)), p.stdout + p.stderr
    assert {(int(s), l) for _, s, l in lines} == {(N, launcher)}, lines


def test_hbmcoll_run():
    _run([sys.executable, "-m", "hbmcoll.run", "-n", str(N), SCRIPT], "hbmcoll-run")


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torch is not installed")
def test_torchrun():
    _run(["torchrun", "--nproc-per-node", str(N), SCRIPT], "torchrun")


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="MPICH is not installed")
def test_mpiexec():
    _run(["mpiexec", "-n", str(N), sys.executable, SCRIPT], "mpiexec")


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="MPICH is not installed")
def test_init_over_mpi4py():
    pytest.importorskip("mpi4py")
    _run(["mpiexec", "-n", str(N), sys.executable, SCRIPT, "--mpi"], "mpi4py")
