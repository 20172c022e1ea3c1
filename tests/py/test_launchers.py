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


def _quick_start(tmp_path):
    """README's Quick start script as it stands, and a line that says what each rank got."""
    with open(os.path.join(HERE, "..", "..", "README.md")) as f:
        readme = f.read()
    block = readme.split("## Quick start", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    script = tmp_path / "train.py"
    script.write_text(block + "\nimport os\nos.write(1, f'quick start rank {comm.rank} of {comm.size}: '"
                              "f'{grads[0]} {params[0]} {None if losses is None else losses.shape}\\n'.encode())\n")
    return str(script)


def _srun(script):
    """srun's environment for one node's step of N tasks, as Slurm sets it."""
    procs = []
    for r in range(N):
        env = dict(_env(), SLURM_JOB_ID="5151", SLURM_STEP_ID="0", SLURM_PROCID=str(r), SLURM_STEP_NUM_TASKS=str(N),
                   SLURM_LOCALID=str(r), SLURM_NODEID="0", SLURM_STEP_TASKS_PER_NODE=str(N),
                   SLURM_STEP_NODELIST="localhost")
        procs.append(subprocess.Popen([sys.executable, script], env=env, stdout=subprocess.PIPE, text=True))
    return "".join(p.communicate(timeout=180)[0] for p in procs)


@pytest.mark.parametrize("launcher", ["hbmcoll-run", "torchrun", "mpiexec", "mpiexec.openmpi", "srun"])
def test_the_quick_start_runs_under_every_launcher(tmp_path, launcher):
    script = _quick_start(tmp_path)
    cmd = {"hbmcoll-run": [sys.executable, "-m", "hbmcoll.run", "-n", str(N), script],
           "torchrun": ["torchrun", "--nproc-per-node", str(N), script],
           "mpiexec": ["mpiexec", "-n", str(N), sys.executable, script],
           "mpiexec.openmpi": ["mpiexec.openmpi", "--allow-run-as-root", "--oversubscribe", "-n", str(N),
                               sys.executable, script]}.get(launcher)
    if cmd is not None and shutil.which(cmd[0]) is None:
        pytest.skip(f"{cmd[0]} is not installed")
    if cmd is None:
        out = _srun(script)
    else:
        p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stdout + p.stderr
        out = p.stdout
    got = sorted(re.findall(r"quick start rank (\d) of (\d): (\S+) (\S+) (.+)", out))
    assert got == [(str(r), str(N), "1.0", "0.0", "(4, 1)" if r == 0 else "None") for r in range(N)], out
