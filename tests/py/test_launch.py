"""hbmcoll.launch.env (synthetic environments) and the hbmcoll-run launcher (real processes).

Both modules are loaded by file path: they use only the standard library and must work before
the C extension (imported by hbmcoll/__init__.py) is built. Timing asserts are generous bounds
("stopped within 20 s"), never measurements.
"""

import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "pymod" / "hbmcoll"
RUN_PY = PKG / "launch" / "run.py"
LAUNCH_ENV_PY = PKG / "launch" / "env.py"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


le = _load("hbmcoll_launch_env_under_test", LAUNCH_ENV_PY)
UID, PPID = os.getuid(), os.getppid()

# Child prologue: load launch_env by path; `report(**extra)` prints one JSON line.
PROLOGUE = f"""\
import importlib.util, json, os, signal, sys, time
_s = importlib.util.spec_from_file_location("launch_env", {str(LAUNCH_ENV_PY)!r})
launch_env = importlib.util.module_from_spec(_s); sys.modules["launch_env"] = launch_env
_s.loader.exec_module(launch_env)
def report(**extra):
    d = dict(vars(launch_env.detect()), pid=os.getpid(), ppid=os.getppid(), **extra)
    os.write(1, (json.dumps(d) + "\\n").encode())  # one write: lines of ranks never interleave
"""

LAUNCH_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "MASTER_ADDR", "MASTER_PORT"}


def clean_env(**extra):
    """Our environment without any launcher's variables (the tests may run under one)."""
    prefixes = ("HBMCOLL_", "PMI_", "MPI_LOCAL", "OMPI_", "PMIX_", "SLURM_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(prefixes) and k not in LAUNCH_VARS}
    env.update(extra)
    return env


def alive(pid):
    """Running (a zombie is dead for this purpose: it only waits for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(cond, timeout=20.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def script(tmp_path, body, name="prog.py"):
    path = tmp_path / name
    path.write_text(PROLOGUE + body)
    return path


def hbmrun(opts, argv, env=None, timeout=60, **kw):
    return subprocess.run([sys.executable, str(RUN_PY), *opts, *map(str, argv)],
                          env=env or clean_env(), capture_output=True, text=True,
                          timeout=timeout, **kw)


def reports(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


# --- launch_env.detect with synthetic environments -------------------------------------------

def test_single_process():
    info = le.detect({})
    assert (info.rank, info.size, info.local_rank, info.local_size) == (0, 1, 0, 1)
    assert info.launcher == "single"
    assert info.job_key == f"u{UID}.single.{os.getpid()}"
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.rank = 1


HBM = dict(HBMCOLL_RANK="2", HBMCOLL_SIZE="4", HBMCOLL_LOCAL_RANK="2", HBMCOLL_LOCAL_SIZE="4")
TORCH = dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", GROUP_RANK="1",
             TORCHELASTIC_RUN_ID="none", TORCHELASTIC_RESTART_COUNT="0")
HYDRA = dict(PMI_RANK="1", PMI_SIZE="3", PMI_FD="6", MPI_LOCALRANKID="1", MPI_LOCALNRANKS="3")
OMPI = dict(OMPI_COMM_WORLD_RANK="5", OMPI_COMM_WORLD_SIZE="6", OMPI_COMM_WORLD_LOCAL_RANK="1",
            OMPI_COMM_WORLD_LOCAL_SIZE="3")
SRUN = dict(SLURM_PROCID="5", SLURM_STEP_NUM_TASKS="8", SLURM_NTASKS="16", SLURM_LOCALID="1",
            SLURM_STEP_TASKS_PER_NODE="4(x2)", SLURM_NODEID="1", SLURM_JOB_ID="123",
            SLURM_STEP_ID="0")
SRUN_NO_STEP = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"}


@pytest.mark.parametrize("env, expect, launcher, key", [
    (dict(HBM, HBMCOLL_JOB_KEY="abc"), (2, 4, 2, 4), "hbmcoll-run", "key.abc"),
    (HBM, (2, 4, 2, 4), "hbmcoll-run", f"hbmcoll-run.{PPID}"),
    (TORCH, (3, 4, 1, 2), "torchrun", f"torchrun.none.{PPID}.r0"),
    (dict(RANK="1", WORLD_SIZE="3", HBMCOLL_JOB_KEY="j"), (1, 3, 1, 3), "torchrun", "key.j"),
    (dict(RANK="0", WORLD_SIZE="1"), (0, 1, 0, 1), "torchrun", f"torchrun.norunid.{PPID}.r0"),
    (HYDRA, (1, 3, 1, 3), "mpiexec", f"mpiexec.{PPID}"),
    (OMPI, (5, 6, 1, 3), "mpiexec", f"ompi.{PPID}"),
    (SRUN, (5, 8, 1, 4), "srun", "srun.123.0"),
    # uneven nodes; older Slurm spells the step id SLURM_STEPID
    (dict(SRUN_NO_STEP, SLURM_STEP_TASKS_PER_NODE="3(x2),2", SLURM_NODEID="2", SLURM_PROCID="6",
          SLURM_LOCALID="0", SLURM_STEPID="7"), (6, 8, 0, 2), "srun", "srun.123.7"),
    # srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE but not hydra's locality variables: a Slurm job
    (dict(SRUN, PMI_RANK="5", PMI_SIZE="8"), (5, 8, 1, 4), "srun", "srun.123.0"),
    # an sbatch/salloc batch shell looks like rank 0 of SLURM_NTASKS but is one process
    (SRUN_NO_STEP, (0, 1, 0, 1), "single", None),
    (dict(SRUN, SLURM_STEP_ID="4294967291"), (0, 1, 0, 1), "single", None),
    # precedence: the closest launcher wins over the ones it runs under
    (dict(SRUN, **HYDRA, **TORCH, **HBM), (2, 4, 2, 4), "hbmcoll-run", f"hbmcoll-run.{PPID}"),
    (dict(SRUN, **HYDRA, **TORCH), (3, 4, 1, 2), "torchrun", f"torchrun.none.{PPID}.r0"),
    (dict(SRUN, **OMPI, **HYDRA), (1, 3, 1, 3), "mpiexec", f"mpiexec.{PPID}"),
    (dict(HYDRA, HBMCOLL_JOB_KEY="mine"), (1, 3, 1, 3), "mpiexec", "key.mine"),
])
def test_detect(env, expect, launcher, key):
    info = le.detect(env)
    assert (info.rank, info.size, info.local_rank, info.local_size) == expect
    assert info.launcher == launcher
    assert info.job_key == f"u{UID}." + (key or f"single.{os.getpid()}")
    assert le.detect(dict(env)) == info  # deterministic: every local rank computes the same key
    # a key the launcher's variables make is no secret: init() adds one (launch/job_secret.py)
    assert info.needs_secret == (launcher != "single" and info.size > 1
                                 and "HBMCOLL_JOB_KEY" not in env)


def test_spawn_style_without_job_key_is_refused():
    # torch.multiprocessing.spawn sets RANK/WORLD_SIZE only: two such jobs of one parent would
    # share every variable, so detect() refuses and names what to set.
    with pytest.raises(ValueError, match="HBMCOLL_JOB_KEY"):
        le.detect(dict(RANK="1", WORLD_SIZE="2"))


def test_job_key_differs_between_jobs():
    keys = {le.detect(dict(HYDRA, HBMCOLL_JOB_KEY=k)).job_key for k in ("a", "b")}
    keys |= {le.detect(dict(TORCH, TORCHELASTIC_RESTART_COUNT="1")).job_key,
             le.detect(TORCH).job_key}
    keys |= {le.detect(dict(SRUN, SLURM_STEP_ID="1")).job_key, le.detect(SRUN).job_key}
    assert len(keys) == 6


@pytest.mark.parametrize("env, names", [
    (dict(HBM, HBMCOLL_RANK="4"), ["HBMCOLL_RANK=4", "HBMCOLL_SIZE=4"]),
    (dict(HBM, HBMCOLL_RANK="-1"), ["HBMCOLL_RANK=-1"]),
    (dict(HBM, HBMCOLL_SIZE="0"), ["HBMCOLL_SIZE=0"]),
    (dict(HBM, HBMCOLL_LOCAL_SIZE="5"), ["HBMCOLL_LOCAL_SIZE=5", "HBMCOLL_SIZE=4"]),
    (dict(HBM, HBMCOLL_LOCAL_RANK="3", HBMCOLL_LOCAL_SIZE="2"), ["HBMCOLL_LOCAL_RANK=3"]),
    (dict(HBM, HBMCOLL_SIZE="four"), ["HBMCOLL_SIZE='four'"]),
    ({"HBMCOLL_RANK": "0"}, ["HBMCOLL_SIZE", "HBMCOLL_LOCAL_RANK", "HBMCOLL_LOCAL_SIZE"]),
    (dict(TORCH, RANK="4"), ["RANK=4", "WORLD_SIZE=4"]),
    (dict(TORCH, LOCAL_RANK="2"), ["LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"]),
    (dict(RANK="0"), ["WORLD_SIZE"]),
    (dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0"), ["LOCAL_WORLD_SIZE"]),
    (dict(HYDRA, PMI_RANK="3"), ["PMI_RANK=3", "PMI_SIZE=3"]),
    (dict(PMI_RANK="0", PMI_SIZE="2"), ["MPI_LOCALRANKID", "MPI_LOCALNRANKS"]),
    (dict(OMPI, OMPI_COMM_WORLD_LOCAL_SIZE=""), ["OMPI_COMM_WORLD_LOCAL_SIZE=''"]),
    (dict(SRUN, SLURM_PROCID="8"), ["SLURM_PROCID=8", "SLURM_STEP_NUM_TASKS=8"]),
    (dict(SRUN, SLURM_STEP_TASKS_PER_NODE="4x2"), ["SLURM_STEP_TASKS_PER_NODE='4x2'"]),
    (dict(SRUN, SLURM_STEP_TASKS_PER_NODE="4,3", SLURM_NODEID="2"), ["SLURM_NODEID=2"]),
    ({k: v for k, v in SRUN.items() if k != "SLURM_LOCALID"}, ["SLURM_LOCALID"]),
])
def test_detect_inconsistent(env, names):
    with pytest.raises(ValueError) as exc:
        le.detect(env)
    for name in names:
        assert name in str(exc.value)


def test_where_nodes_meet():
    from hbmcoll.nodes import where

    with pytest.raises(ValueError, match="set MASTER_ADDR"):
        where.meeting_point(dict(HYDRA), "mpiexec")
    with pytest.raises(ValueError, match="HBMCOLL_JOB_KEY"):
        where.meeting_point(dict(TORCH, MASTER_ADDR="10.0.0.1", MASTER_PORT="29500"), "torchrun")
    assert where.meeting_point(dict(TORCH, MASTER_ADDR="10.0.0.1", MASTER_PORT="29500", HBMCOLL_JOB_KEY="k"),
                                "torchrun") == ("10.0.0.1", 29501, "k")
    assert where.meeting_point(dict(HYDRA, HBMCOLL_MASTER="h0", HBMCOLL_JOB_KEY="k"), "mpiexec") == ("h0", 29600, "k")
    with pytest.raises(ValueError, match="HBMCOLL_PORT='x'"):
        where.meeting_point(dict(HYDRA, HBMCOLL_MASTER="h0", HBMCOLL_PORT="x", HBMCOLL_JOB_KEY="k"), "mpiexec")
    srun = dict(SRUN, SLURM_STEP_NODELIST="kn[03-05,9],gpu1", HBMCOLL_JOB_KEY="k")
    assert where.meeting_point(srun, "srun") == ("kn03", 29600, "k")
    assert where._first_host("solo") == "solo"


# --- the launcher with real processes ---------------------------------------------------------

def test_ranks_get_distinct_env(tmp_path):
    prog = script(tmp_path, """
e = os.environ
report(torch=[int(e[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")],
       master=[e["MASTER_ADDR"], e["MASTER_PORT"]], stdin=sys.stdin.read(),
       opts=[e.get(k) for k in ("HBMCOLL_BIND", "HBMCOLL_MEMORY", "HBMCOLL_TIMEOUT")])
""")
    opts = ["-n", "4", "--bind", "core", "--memory", "hbm_bind", "--timeout", "7.5"]
    runs = [hbmrun(opts, [prog], input="hello") for _ in range(2)]
    keys = []
    for r in runs:
        assert r.returncode == 0, r.stderr
        out = sorted(reports(r.stdout), key=lambda d: d["rank"])
        assert [d["rank"] for d in out] == [0, 1, 2, 3]
        for d in out:
            assert (d["size"], d["local_rank"], d["local_size"]) == (4, d["rank"], 4)
            assert d["launcher"] == "hbmcoll-run"
            assert d["torch"] == [d["rank"], 4, d["rank"], 4]
            assert d["opts"] == ["core", "hbm_bind", "7.5"]
            assert d["stdin"] == ("hello" if d["rank"] == 0 else "")  # stdin to rank 0 only
        assert len({d["job_key"] for d in out}) == 1 and len({d["ppid"] for d in out}) == 1
        assert len({tuple(d["master"]) for d in out}) == 1 and out[0]["master"][0] == "127.0.0.1"
        keys.append(out[0]["job_key"])
    assert keys[0] != keys[1] and keys[0].startswith(f"u{UID}.key.")


@pytest.mark.parametrize("opts", [["--nproc-per-node", "3"], ["--nproc-per-node=3"], ["--np", "3"]])
def test_torchruns_name_for_ranks_per_node(tmp_path, opts):
    prog = script(tmp_path, "report()\n")
    r = hbmrun(opts, [prog])
    assert r.returncode == 0, r.stderr
    assert sorted(d["rank"] for d in reports(r.stdout)) == [0, 1, 2]
    help_text = hbmrun(["--help"], []).stdout
    assert "--nproc-per-node" in help_text and "per node" in help_text


def test_exit_code_of_failing_rank(tmp_path):
    prog = script(tmp_path, "sys.exit(3 if launch_env.detect().rank == 1 else 0)\n")
    r = hbmrun(["-n", "3"], [prog])
    assert r.returncode == 3
    assert "rank 1 (pid" in r.stderr and "exited with code 3" in r.stderr


def test_failing_rank_stops_the_others(tmp_path):
    prog = script(tmp_path, """
rank = launch_env.detect().rank
from pathlib import Path
Path(sys.argv[1], f"{rank}.pid").write_text(str(os.getpid()))
if rank == 2:  # fail once the others are surely running
    while len(list(Path(sys.argv[1]).glob("*.pid"))) < 4: time.sleep(0.02)
    sys.exit(1)
time.sleep(300)
""")
    t0 = time.monotonic()
    r = hbmrun(["-n", "4"], [prog, tmp_path])
    assert time.monotonic() - t0 < 20
    assert r.returncode == 1
    assert "exited with code 1; stopping the other 3 ranks" in r.stderr
    assert r.stderr.count("hbmcoll-run:") == 1, r.stderr  # one clear line
    assert not any(alive(int(p.read_text())) for p in tmp_path.glob("*.pid"))


def test_stubborn_ranks_get_sigkill(tmp_path):
    prog = script(tmp_path, """
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if launch_env.detect().rank == 0: time.sleep(0.5); sys.exit(5)
time.sleep(300)
""")
    t0 = time.monotonic()
    r = hbmrun(["-n", "3"], [prog], env=clean_env(HBMCOLL_KILL_GRACE="1"))
    assert time.monotonic() - t0 < 20
    assert r.returncode == 5
    assert "SIGKILL" in r.stderr


def test_rank_killed_by_signal(tmp_path):
    prog = script(tmp_path, """
if launch_env.detect().rank == 1: os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(300)
""")
    r = hbmrun(["-n", "2"], [prog])
    assert r.returncode == 128 + signal.SIGUSR1
    assert "rank 1 (pid" in r.stderr and "killed by SIGUSR1" in r.stderr


def start_sleepers(tmp_path, n, body="time.sleep(300)\n"):
    """A launcher (in its own process group, like a terminal job) whose ranks wrote pid files."""
    prog = script(tmp_path, f"""
from pathlib import Path
Path(sys.argv[1], f"{{launch_env.detect().rank}}.pid").write_text(str(os.getpid()))
{body}""")
    argv = [sys.executable, str(RUN_PY), "-n", str(n), str(prog), str(tmp_path)]
    launcher = subprocess.Popen(argv, env=clean_env(), stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    _started.append((launcher, tmp_path))
    assert wait_for(lambda: len(list(tmp_path.glob("*.pid"))) == n and
                    all(p.read_text() for p in tmp_path.glob("*.pid")))
    return launcher, [int(p.read_text()) for p in tmp_path.glob("*.pid")]


_started = []


@pytest.fixture(autouse=True)
def _kill_started_launchers():
    """Whatever a test's outcome: its launcher and every rank it wrote a pid file for die."""
    yield
    while _started:
        launcher, tmp_path = _started.pop()
        pids = [launcher.pid]
        for f in tmp_path.glob("*.pid"):
            try:
                pids.append(int(f.read_text()))
            except ValueError:
                pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        launcher.wait(timeout=10)


def test_sigint_to_launcher_stops_everyone(tmp_path):
    launcher, pids = start_sleepers(tmp_path, 3)
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=20) == 128 + signal.SIGINT
    assert "got SIGINT; forwarding it to 3 ranks" in launcher.stderr.read()
    assert wait_for(lambda: not any(alive(p) for p in pids))


def test_terminal_ctrl_c_reaches_each_rank_once(tmp_path):
    # A terminal sends SIGINT to the launcher's whole process group; ranks must see one SIGINT.
    launcher, pids = start_sleepers(tmp_path, 3, """
seen = []
signal.signal(signal.SIGINT, lambda *a: seen.append(1))
while not seen: time.sleep(0.01)
time.sleep(1.0)  # time for a duplicate to arrive
Path(sys.argv[1], f"{os.getpid()}.count").write_text(str(len(seen)))
""")
    os.killpg(launcher.pid, signal.SIGINT)
    assert launcher.wait(timeout=20) == 128 + signal.SIGINT
    assert sorted(int(p.stem) for p in tmp_path.glob("*.count")) == sorted(pids)
    assert [p.read_text() for p in tmp_path.glob("*.count")] == ["1"] * 3


def test_sigkill_of_launcher_kills_ranks(tmp_path):
    launcher, pids = start_sleepers(tmp_path, 3)
    launcher.kill()
    launcher.wait(timeout=20)
    assert wait_for(lambda: not any(alive(p) for p in pids)), "ranks outlived their launcher"


def test_module_and_path_programs(tmp_path):
    (tmp_path / "hbm_test_mod.py").write_text(PROLOGUE + "report(argv=sys.argv[1:])\n")
    r = hbmrun(["-n", "2"], ["-m", "hbm_test_mod", "--flag", "-n", "9"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(d["rank"] for d in reports(r.stdout)) == [0, 1]
    assert all(d["argv"] == ["--flag", "-n", "9"] for d in reports(r.stdout))
    # an executable on PATH runs as is, not through Python
    r = hbmrun(["-n", "2"], ["sh", "-c", 'echo "rank=$HBMCOLL_RANK"'])
    assert r.returncode == 0 and sorted(r.stdout.split()) == ["rank=0", "rank=1"]


def test_tag_output(tmp_path):
    r = hbmrun(["-n", "2", "--tag-output"],
               ["sh", "-c", 'echo "a$RANK"; echo "e$RANK" >&2; printf x'])
    assert r.returncode == 0
    assert sorted(r.stdout.splitlines()) == ["[0] a0", "[0] x", "[1] a1", "[1] x"]
    assert sorted(r.stderr.splitlines()) == ["[0] e0", "[1] e1"]


@pytest.mark.parametrize("opts, argv, env, msg", [
    (["-n", "0"], ["true"], {}, "-n must be >= 1"),
    (["-n", "2"], [], {}, "no program given"),
    (["-n", "2", "--bind", "socket"], ["true"], {}, "invalid choice"),
    (["-n", "2", "--timeout", "-1"], ["true"], {}, "--timeout must be"),
    (["-n", "2"], ["true"], {"HBMCOLL_KILL_GRACE": "soon"}, "HBMCOLL_KILL_GRACE='soon'"),
])
def test_bad_usage(opts, argv, env, msg):
    r = hbmrun(opts, argv, env=clean_env(**env))
    assert r.returncode == 2 and msg in r.stderr


def test_python_dash_m_hbmcoll_run(tmp_path):
    env = clean_env(PYTHONPATH=str(PKG.parent))
    if subprocess.run([sys.executable, "-c", "import hbmcoll.run"], env=env).returncode:
        pytest.skip("the hbmcoll package does not import here (C extension not built)")
    r = subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", "2", "sh", "-c", "echo $RANK"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and sorted(r.stdout.split()) == ["0", "1"]


# --- other launchers, for real ----------------------------------------------------------------

def check_job(out, n, launcher):
    assert sorted(d["rank"] for d in out) == list(range(n))
    assert all((d["size"], d["local_size"], d["launcher"]) == (n, n, launcher) for d in out)
    assert len({d["job_key"] for d in out}) == 1, out
    assert out[0]["job_key"].startswith(f"u{UID}.")


@pytest.mark.skipif(not shutil.which("mpiexec"), reason="no mpiexec")
def test_real_mpiexec(tmp_path):
    prog = script(tmp_path, "report()\n")
    r = subprocess.run(["mpiexec", "-n", "3", sys.executable, str(prog)], env=clean_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = reports(r.stdout)
    check_job(out, 3, "mpiexec")
    assert out[0]["job_key"] == f"u{UID}.mpiexec.{out[0]['ppid']}"  # hydra_pmi_proxy's pid


@pytest.mark.skipif(not shutil.which("torchrun"), reason="no torchrun")
def test_real_torchrun(tmp_path):
    prog = script(tmp_path, "report(run_id=os.environ['TORCHELASTIC_RUN_ID'])\n")
    r = subprocess.run(["torchrun", "--nproc-per-node", "2", str(prog)], env=clean_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = reports(r.stdout)
    check_job(out, 2, "torchrun")
    assert out[0]["job_key"] == f"u{UID}.torchrun.{out[0]['run_id']}.{out[0]['ppid']}.r0"


def test_torch_script_runs_unchanged(tmp_path):
    pytest.importorskip("torch")
    prog = tmp_path / "dist.py"
    prog.write_text("""
import torch, torch.distributed as dist
dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)
print(dist.get_rank(), dist.get_world_size(), t.item(), flush=True)
dist.destroy_process_group()
""")
    r = hbmrun(["-n", "3", "--tag-output"], [prog], timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [f"[{i}] {i} 3 6.0" for i in range(3)]
