"""Who am I in this job? Rank, size, locality and a job key from the launcher's environment.

Pure standard library and no import of the C extension, so the launcher (launch/run.py), tests and
child processes can load this file on its own.

Launchers are tried from the closest wrapper outwards: our own hbmcoll-run, torchrun, MPICH hydra /
Open MPI mpiexec, Slurm srun, else a single process. A launcher is picked by one marker variable;
once picked, its other variables must be there and agree, or we raise ValueError naming them
(a half-set environment is a misconfiguration, and guessing would hang the rendezvous).

The job key names the rendezvous of the local ranks of one job. It is the same for all ranks of a
job on one node and differs between concurrent jobs; it always contains the uid, so two users'
jobs never meet. Under launchers without a job id it is the parent pid: all local ranks of one job
are children of the same process (hydra_pmi_proxy, orted/prted, torchrun's agent), which stays
alive for the job's lifetime, so its pid cannot be reused meanwhile. That breaks if a rank is
wrapped in a shell (`mpiexec sh -c 'python x.py'`): set HBMCOLL_JOB_KEY then. HBMCOLL_JOB_KEY
overrides the key under every launcher, so it must differ between jobs running at the same time
(hbmcoll-run always sets a fresh random one).

Such keys name the job but are no secret: another local user can compute them. So unless
HBMCOLL_JOB_KEY is set, `needs_secret` tells init() to add a nonce that local rank 0 draws and
hands over in a private directory (job_secret.py). RANK/WORLD_SIZE without torchrun's ids
(torch.multiprocessing.spawn) name no job at all: detect() refuses them unless HBMCOLL_JOB_KEY
is set.
"""

import os
import re
from dataclasses import dataclass

try:
    from ..errors import ArgumentError
except ImportError:  # this file runs by path too (hbmcoll-run): the package's errors.py, by path
    import importlib.util as _util
    _spec = _util.spec_from_file_location(
        "_hbmcoll_errors", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "errors.py"))
    _errors = _util.module_from_spec(_spec)
    _spec.loader.exec_module(_errors)
    ArgumentError = _errors.ArgumentError

LAUNCHERS = ("hbmcoll-run", "torchrun", "mpiexec", "srun", "single")
# What sizes a rank's OpenMP/BLAS pools; set from its share of the cores (hbmcoll-run, init()).
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class LaunchInfo:
    rank: int
    size: int
    local_rank: int
    local_size: int
    job_key: str
    launcher: str
    # the key holds no secret of the job: local rank 0 draws one for the others (job_secret.py)
    needs_secret: bool = False


def _int(env, name):
    value = env.get(name)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ArgumentError(f"{name}={value!r} is not an integer") from None


def _need(env, launcher, names):
    missing = [n for n in names if n not in env]
    if missing:
        present = [n for n in names if n in env]
        raise ArgumentError(f"{launcher} environment is incomplete: {', '.join(present)} "
                         f"set but {', '.join(missing)} missing")


def _first(env, *names):
    return next((n for n in names if n in env), names[0])


def _tasks_per_node(spec, name):
    """Expand Slurm's compressed task counts, e.g. '2(x3),1' -> [2, 2, 2, 1]."""
    counts = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ArgumentError(f"{name}={spec!r} is not a Slurm task count list like '2(x3),1'")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _hbmcoll_run(env):
    names = ("HBMCOLL_RANK", "HBMCOLL_SIZE", "HBMCOLL_LOCAL_RANK", "HBMCOLL_LOCAL_SIZE")
    _need(env, "hbmcoll-run", names)
    return [(n, _int(env, n)) for n in names], f"hbmcoll-run.{os.getppid()}"


def _torchrun(env):
    _need(env, "torchrun", ("RANK", "WORLD_SIZE"))
    rank, size = ("RANK", _int(env, "RANK")), ("WORLD_SIZE", _int(env, "WORLD_SIZE"))
    local = ("LOCAL_RANK", "LOCAL_WORLD_SIZE")
    if any(n in env for n in local):
        _need(env, "torchrun", local)
        local_rank = ("LOCAL_RANK", _int(env, "LOCAL_RANK"))
        local_size = ("LOCAL_WORLD_SIZE", _int(env, "LOCAL_WORLD_SIZE"))
    else:
        # RANK/WORLD_SIZE alone: torch.multiprocessing.spawn style, one node by construction.
        local_rank, local_size = rank, size
    if "TORCHELASTIC_RUN_ID" not in env and not env.get("HBMCOLL_JOB_KEY") and size[1] > 1:
        # No launcher id: two such jobs started by one process (mp.spawn twice) look the same,
        # and their ranks could pair up. Refuse rather than guess.
        raise ArgumentError(
            "RANK/WORLD_SIZE are set without a launcher's job id (torch.multiprocessing.spawn "
            "style), so this job cannot be told apart from another started the same way: set "
            "HBMCOLL_JOB_KEY to a secret unique to this job and the same on all its ranks (e.g. "
            "secrets.token_hex(16) drawn by the parent), or use dist.init_process_group(\"hbmcoll\"), "
            "which agrees on one through torch's store")
    # torchrun's run id defaults to "none" for multi-node static rendezvous, so it is not unique
    # on its own; the agent's pid (our parent) is. The restart count keeps a restarted worker
    # group apart from the one being torn down.
    run_id = env.get("TORCHELASTIC_RUN_ID", "norunid")
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return [rank, size, local_rank, local_size], f"torchrun.{run_id}.{os.getppid()}.r{restart}"


def _hydra(env):
    names = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    _need(env, "MPICH hydra", names)
    # Checked: under MPICH 4.0.2 hydra all local ranks share hydra_pmi_proxy as parent.
    return [(n, _int(env, n)) for n in names], f"mpiexec.{os.getppid()}"


def _openmpi(env):
    names = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
             "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    _need(env, "Open MPI", names)
    return [(n, _int(env, n)) for n in names], f"ompi.{os.getppid()}"


def _srun(env):
    step_var = "SLURM_STEP_ID" if "SLURM_STEP_ID" in env else "SLURM_STEPID"
    # The step's own counts first: the job's (SLURM_NTASKS...) differ when a step uses part of it.
    size_var = _first(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    per_node_var = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    _need(env, "Slurm srun",
          ("SLURM_PROCID", size_var, "SLURM_LOCALID", per_node_var, "SLURM_JOB_ID"))
    counts = _tasks_per_node(env[per_node_var], per_node_var)
    if len(set(counts)) == 1:
        local_size = counts[0]
    else:  # uneven nodes: pick ours by the step-relative node index
        node = _int(env, "SLURM_NODEID")
        if not 0 <= node < len(counts):
            raise ArgumentError(f"SLURM_NODEID={node} is outside {per_node_var}={env[per_node_var]!r}")
        local_size = counts[node]
    values = [("SLURM_PROCID", _int(env, "SLURM_PROCID")), (size_var, _int(env, size_var)),
              ("SLURM_LOCALID", _int(env, "SLURM_LOCALID")), (per_node_var, local_size)]
    return values, f"srun.{env['SLURM_JOB_ID']}.{env[step_var]}"


def _is_srun_step(env):
    # The batch script of sbatch/salloc also has SLURM_PROCID=0 and SLURM_NTASKS=N, but it is one
    # process, not rank 0 of N: only a real srun step sets a numeric step id below Slurm's
    # reserved ids (batch, extern, interactive are 0xfffffff0 and up).
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    return "SLURM_PROCID" in env and step is not None and step.isdigit() and int(step) < 0xFFFFFFF0


def detect(environ=os.environ):
    """Return the LaunchInfo of this process; ValueError names inconsistent variables."""
    env = environ
    if "HBMCOLL_RANK" in env:
        launcher, (values, key) = "hbmcoll-run", _hbmcoll_run(env)
    elif "RANK" in env or "WORLD_SIZE" in env:
        launcher, (values, key) = "torchrun", _torchrun(env)
    elif "PMI_RANK" in env and ("MPI_LOCALRANKID" in env or not _is_srun_step(env)):
        # (srun --mpi=pmi2 sets PMI_RANK without hydra's locality variables: a Slurm job)
        launcher, (values, key) = "mpiexec", _hydra(env)
    elif "OMPI_COMM_WORLD_RANK" in env:
        launcher, (values, key) = "mpiexec", _openmpi(env)
    elif _is_srun_step(env):
        launcher, (values, key) = "srun", _srun(env)
    else:
        launcher, key = "single", f"single.{os.getpid()}"
        values = [("", 0), ("", 1), ("", 0), ("", 1)]
    (rank_n, rank), (size_n, size), (lrank_n, lrank), (lsize_n, lsize) = values

    if size < 1 or lsize < 1:
        raise ArgumentError(f"{launcher}: sizes must be >= 1, got {size_n}={size}, {lsize_n}={lsize}")
    if not 0 <= rank < size:
        raise ArgumentError(f"{launcher}: {rank_n}={rank} is outside 0..{size - 1} ({size_n}={size})")
    if lsize > size:
        raise ArgumentError(f"{launcher}: {lsize_n}={lsize} exceeds {size_n}={size}")
    if not 0 <= lrank < lsize:
        raise ArgumentError(
            f"{launcher}: {lrank_n}={lrank} is outside 0..{lsize - 1} ({lsize_n}={lsize})")

    needs_secret = launcher != "single"
    if env.get("HBMCOLL_JOB_KEY"):
        key, needs_secret = "key." + env["HBMCOLL_JOB_KEY"], False
    return LaunchInfo(rank, size, lrank, lsize, f"u{os.getuid()}.{key}", launcher,
                      needs_secret and size > 1)


# HBMCOLL_PORTS=LO-HI: every port the job listens on across nodes, in one range a firewall can open:
# the rendezvous of ring l at LO + l, memory servers at LO + 64 + k, and libfabric's tcp endpoints
# (the bridge's and point-to-point's: FI_TCP_PORT_LOW_RANGE / HIGH_RANGE) from LO + 256 to HI
# (LO + 128 to LO + 255 stay free: the socket path of point-to-point had them).
PORTS_RINGS, PORTS_SERVERS, PORTS_BRIDGE = 0, 64, 256
PORTS_MIN = 512


def port_range(env):
    """(lo, hi) from HBMCOLL_PORTS, or None when unset; ValueError naming the variable otherwise."""
    text = env.get("HBMCOLL_PORTS", "").strip()
    if not text:
        return None
    m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", text)
    lo, hi = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if not m or not 1024 <= lo < hi <= 65535 or hi - lo + 1 < PORTS_MIN:
        raise ValueError(f"HBMCOLL_PORTS={text!r}: give a range LO-HI of at least {PORTS_MIN} ports within "
                         "1024-65535, e.g. 30000-30999 (rings from LO, memory servers from LO+64, point-to-point "
                         "from LO+128, the bridge's endpoints from LO+256)")
    return lo, hi
