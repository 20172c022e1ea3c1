#!/usr/bin/env python3
"""hbmcoll benchmark driver: hbmcoll against mpi4py+MPICH, torch.distributed (gloo) and
DeepSpeed's shared-memory CPU allreduce.

Each library runs under its own launcher (mpiexec, torchrun, deepspeed, python -m hbmcoll.run) with its
worker in bench/workers/; rounds interleave the libraries so machine noise hits all alike.
Writes bench/results/<timestamp>/{results.json,results.csv,rounds.csv,table.md,*.png} and
points bench/results/latest at it (./hbmcoll-bench-results/ when the suite runs from an
installed hbmcoll). Timings are never asserted anywhere; this gates nothing.

    python bench/suite.py               # quick mode (default), < 10 min on 2 cores
    python bench/suite.py --full        # OSU sweep 4 B .. 64 MiB, all collectives and variants
    sudo python bench/suite.py --nodes  # and across 2 emulated nodes (bench/net_bridge.py)
    python -m hbmcoll.bench [same options]   # also from an installed hbmcoll (hbmcoll._bench)

The hbmcoll under test is the one `import hbmcoll` gives this Python, except that the suite of
a checkout whose extension is built in place (pymod/hbmcoll/_core*.so, `make build`) puts that
checkout's pymod/ first. If that hbmcoll does not load, the suite stops with one line and exit
status 1; a missing peer (mpi4py, torch) is skipped with a line.
"""
import argparse
import datetime
import glob
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))   # bench/, or hbmcoll/_bench/ installed
REPO = os.path.dirname(HERE)
PYMOD = os.path.join(REPO, "pymod")
IN_CHECKOUT = os.path.isfile(os.path.join(PYMOD, "hbmcoll", "__init__.py"))
WORKERS = os.path.join(HERE, "workers")
sys.path.insert(0, HERE)
import limits as L  # noqa: E402
import machine  # noqa: E402
import noise  # noqa: E402
import report  # noqa: E402

ALL_COLLS = ["allreduce", "bcast", "gather", "reduce", "allgather", "reduce_scatter",
             "alltoall", "barrier"]
KiB, MiB = 1 << 10, 1 << 20
QUICK = {"sizes": [8, 64 * KiB, MiB, 16 * MiB],
         "collectives": ["allreduce", "bcast", "gather", "reduce", "barrier"],
         "rounds": 7, "buffers": ["numpy", "empty"], "memory": ["hbm_preferred"],
         "bind": ["core"], "oversub_iters": 1000, "oversub_timeout": 240, "timeout": 300}
FULL = {"sizes": [4 << i for i in range(25)], "collectives": ALL_COLLS, "rounds": 1,
        "buffers": ["numpy", "empty"], "memory": ["hbm_preferred", "ddr"],
        "bind": ["core", "none"], "oversub_iters": 10000, "oversub_timeout": 1200,
        "timeout": 3600}


def parse_size(s):
    s = s.strip().upper().replace("IB", "").replace("B", "")
    mult = {"K": KiB, "M": MiB, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s.rstrip("KMG")) * mult)


def csv_list(s):
    return [x for x in s.split(",") if x]


LIBS = ("mpi4py", "openmpi", "torch", "deepspeed", "hbmcoll", "floor", "floor-staged")
# Open MPI's peer: mpi4py built against Open MPI, in a virtual environment of its own (Debian's
# mpi4py here is MPICH's); `make openmpi-peer` makes it at build/ompi-venv
OMPI_PYTHON = os.environ.get("HBMCOLL_BENCH_OPENMPI_PYTHON") or os.path.join(
    os.path.dirname(HERE), "build", "ompi-venv", "bin", "python")
# DeepSpeed's peer: its shared-memory CPU allreduce, in a virtual environment that reuses the
# system's torch; `make deepspeed-peer` makes it at build/ds-venv and builds the shm op there
DS_VENV = os.path.join(os.path.dirname(HERE), "build", "ds-venv")
DS_PYTHON = os.environ.get("HBMCOLL_BENCH_DEEPSPEED_PYTHON") or os.path.join(DS_VENV, "bin", "python")


def lib_list(s):
    libs = csv_list(s)
    bad = [x for x in libs if x not in LIBS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)}: choose from {', '.join(LIBS)}")
    return libs


def args_parser():
    ap = argparse.ArgumentParser(prog="python -m hbmcoll.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="quick mode (the default)")
    ap.add_argument("--full", action="store_true", help="full OSU sweep, every variant")
    ap.add_argument("--libs", type=lib_list, default=list(LIBS),
                    help=f"comma-separated, from {', '.join(LIBS)}. mpi4py: MPICH's collectives; openmpi: Open "
                         "MPI's, through mpi4py built against it (HBMCOLL_BENCH_OPENMPI_PYTHON, default "
                         "build/ompi-venv: `make openmpi-peer`); torch: "
                         "gloo; deepspeed: DeepSpeed's shared-memory CPU allreduce, allreduce only "
                         "(HBMCOLL_BENCH_DEEPSPEED_PYTHON, default build/ds-venv: `make "
                         "deepspeed-peer`); hbmcoll: NumPy buffers (hbmcoll-numpy) and hbmcoll.empty ones "
                         "(hbmcoll-empty); floor: no communication, only the memory work of an "
                         "out-of-place allreduce on each rank; floor-staged: that plus the least data "
                         "that must cross between ranks, in bare C (bench/workers/floor_worker.py)")
    ap.add_argument("--np", type=lambda s: [int(x) for x in csv_list(s)],
                    help="world sizes, e.g. 2,4,64 (quick: 2; full: 2 and the core count)")
    ap.add_argument("--collectives", type=csv_list)
    ap.add_argument("--sizes", type=lambda s: [parse_size(x) for x in csv_list(s)],
                    help="e.g. 8,64K,1M,16M")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (quick 7, full 1)")
    ap.add_argument("--buffers", type=csv_list, help="hbmcoll buffers: numpy,empty")
    ap.add_argument("--memory", type=csv_list, help="HBMCOLL_MEMORY values: hbm_preferred,ddr")
    ap.add_argument("--bind", type=csv_list, help="HBMCOLL_BIND values: core,none")
    ap.add_argument("--iters", type=int, help="timed iterations up to 8 KB (default 10000)")
    ap.add_argument("--iters-large", type=int, help="timed iterations above 8 KB (default 100)")
    ap.add_argument("--oversub-np", type=int, default=8, help="ranks for the oversubscribed case")
    ap.add_argument("--oversub-iters", type=int, help="8-byte allreduces there (quick 1000)")
    ap.add_argument("--oversub-timeout", type=float, help="seconds (quick 240, full 1200)")
    ap.add_argument("--no-oversub", action="store_true")
    ap.add_argument("--no-limits", action="store_true", help="skip the copy-bandwidth limit")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--nodes", action="store_true",
                    help="also across 2 emulated nodes, 1 and 2 ranks each, links uncapped and capped "
                         "(bench/net_bridge.py: hbmcoll, gloo, MPICH; needs root) -> nodes.md")
    ap.add_argument("--timeout", type=float, help="seconds per launch before it is killed")
    ap.add_argument("--wait-idle", type=float, default=0, metavar="SECONDS",
                    help="before each launch wait up to this long for the CPUs to be idle "
                         "(< 25%% busy); for shared machines")
    ap.add_argument("--out", help="results root (default bench/results; installed: "
                                  "./hbmcoll-bench-results)")
    ap.add_argument("--verbose", action="store_true", help="workers report progress too")
    return ap


def settings(a):
    base = dict(FULL if a.full else QUICK)
    base["mode"] = "full" if a.full else "quick"
    ncores = len(os.sched_getaffinity(0))
    base["np"] = a.np or ([2] if not a.full else sorted({2, max(2, ncores)}))
    for k in ("collectives", "sizes", "rounds", "buffers", "memory", "bind", "timeout",
              "oversub_iters", "oversub_timeout"):
        if getattr(a, k) is not None:
            base[k] = getattr(a, k)
    return base


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def built_checkout():
    """This checkout's pymod/ when its extension is built there, else None: an unbuilt
    checkout must not shadow the hbmcoll that is installed."""
    if IN_CHECKOUT and glob.glob(os.path.join(PYMOD, "hbmcoll", "_core*.so")):
        return PYMOD
    return None


def env_with(extra):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"          # one intra-op thread everywhere (torch fairness)
    env["PYTHONUNBUFFERED"] = "1"
    pymod = built_checkout()
    if pymod:
        env["PYTHONPATH"] = os.pathsep.join([pymod] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(extra)
    return env


# Where `import hbmcoll` leads (found without running it), then whether it loads with its
# extension: the error of a package without one would be an import cycle's.
HBMCOLL_PROBE = """
import importlib.machinery as m, importlib.util as u, os, sys
spec = u.find_spec("hbmcoll")
if spec is None:
    sys.exit("No module named 'hbmcoll'")
dirs = list(spec.submodule_search_locations or [])
print(os.path.dirname(spec.origin) if spec.origin else os.pathsep.join(dirs), flush=True)
if not any(os.path.exists(os.path.join(d, "_core" + x))
           for d in dirs for x in m.EXTENSION_SUFFIXES):
    sys.exit("its extension hbmcoll._core is not built there")
import hbmcoll, hbmcoll.run
hbmcoll.init, hbmcoll.empty
"""


def hbmcoll_under_test():
    """(where, error): the folder of the hbmcoll the workers will import (None: none), and why
    it does not load (None: it does)."""
    p = subprocess.run([sys.executable, "-c", HBMCOLL_PROBE], env=env_with({}),
                       capture_output=True, text=True, timeout=120)
    where = (p.stdout.strip().splitlines() or [None])[0]
    if p.returncode == 0:
        return where, None
    return where, (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]


def ds_env():
    """What DeepSpeed's launches get: its CPU accelerator, the venv's scripts first on PATH as
    when it is activated (the shm op's JIT load wants ninja there), and the folder its shm op is
    built in (build/ds-venv/torch_extensions, as `make deepspeed-peer` builds it; with
    HBMCOLL_BENCH_DEEPSPEED_PYTHON, the caller's TORCH_EXTENSIONS_DIR or torch's default)."""
    env = {"DS_ACCELERATOR": "cpu",
           "PATH": os.pathsep.join([os.path.dirname(DS_PYTHON), os.environ.get("PATH", "")])}
    if not os.environ.get("HBMCOLL_BENCH_DEEPSPEED_PYTHON"):
        env["TORCH_EXTENSIONS_DIR"] = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
            DS_VENV, "torch_extensions")
    return env


def available(lib):
    """(ok, reason): the library imports and its launcher exists."""
    if lib == "deepspeed":            # the worker's own check: DeepSpeed imports, the shm op
        if not os.path.exists(DS_PYTHON):   # loads (built here if it is not yet, ~30 s) and runs
            return False, f"no Python for DeepSpeed at {DS_PYTHON} (`make deepspeed-peer` makes build/ds-venv)"
        try:
            p = subprocess.run([DS_PYTHON, os.path.join(WORKERS, "deepspeed_worker.py"), "--check"],
                               env=env_with(ds_env()), capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return False, "its shm op did not build in 600 s"
        return (True, "") if p.returncode == 0 else (
            False, (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1])
    probes = {"mpi4py": ("import mpi4py.MPI", "mpiexec"),
              "openmpi": ("from mpi4py import MPI; assert 'Open MPI' in MPI.Get_library_version()",
                          "mpiexec.openmpi"),
              "torch": ("import torch.distributed as d; assert d.is_gloo_available()", None),
              "hbmcoll": ("import hbmcoll, importlib.util as u; hbmcoll.init; hbmcoll.empty; "
                          "assert u.find_spec('hbmcoll.run')",
                          None),
              "floor": ("import numpy", None),
              "floor-staged": ("import numpy", os.environ.get("CC", "cc"))}
    code, launcher = probes[lib]
    if launcher and not shutil.which(launcher):
        return False, f"{launcher} not on PATH"
    python = sys.executable
    if lib == "openmpi":
        python = OMPI_PYTHON
        if not os.path.exists(python):
            return False, f"no mpi4py built against Open MPI at {python} (`make openmpi-peer` makes one)"
    p = subprocess.run([python, "-c", code], env=env_with({}), capture_output=True,
                       text=True, timeout=120)
    if p.returncode:
        return False, (p.stderr.strip().splitlines() or ["import failed"])[-1]
    return True, ""


def command(lib, P, spec_path, prefix):
    worker = os.path.join(WORKERS, f"{lib}_worker.py")
    if lib in ("floor", "floor-staged"):
        return [sys.executable, os.path.join(WORKERS, "floor_worker.py"), str(P), spec_path,
                prefix] + (["staged"] if lib == "floor-staged" else [])
    if lib == "mpi4py":
        return ["mpiexec", "-n", str(P), sys.executable, worker, spec_path, prefix]
    if lib == "openmpi":  # the same worker, as Open MPI's users launch it (root and oversubscribed allowed)
        return ["mpiexec.openmpi", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(P),
                OMPI_PYTHON, os.path.join(WORKERS, "mpi4py_worker.py"), spec_path, prefix]
    if lib == "deepspeed":  # its launcher, as its CPU docs run it: a core (one thread) per rank
        cpus = sorted(os.sched_getaffinity(0))[:P]
        launcher = os.path.join(os.path.dirname(DS_PYTHON), "deepspeed")
        bind = ["--bind_cores_to_rank", f"--bind_core_list={','.join(map(str, cpus))}"]
        return ([launcher] if os.path.exists(launcher) else [DS_PYTHON, "-m", "deepspeed.launcher.runner"]) + [
            f"--num_accelerators={P}", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
            "--no_local_rank"] + (bind if len(cpus) == P else []) + [worker, spec_path, prefix]
    if lib == "torch":
        run = ["torchrun"] if shutil.which("torchrun") else [sys.executable, "-m",
                                                                 "torch.distributed.run"]
        return run + [f"--nproc-per-node={P}", "--master-addr=127.0.0.1",
                      f"--master-port={free_port()}", worker, spec_path, prefix]
    return [sys.executable, "-m", "hbmcoll.run", "-n", str(P), worker, spec_path, prefix]


def launch(cmd, env, timeout, log_path):
    """Run one launcher in its own session; on timeout end that session's processes."""
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=HERE)
        try:
            rc = p.wait(timeout=timeout)
            status = "ok" if rc == 0 else f"exit {rc}"
        except subprocess.TimeoutExpired:
            status = "timeout"
            end_session(p)
        except BaseException:                 # Ctrl-C or SIGTERM of the driver: no orphans
            end_session(p)
            raise
    return status, time.monotonic() - t0


def end_session(p):
    """SIGTERM, then SIGKILL, to the launcher's own session (only what we started)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            pass


class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal)."""

    def __init__(self, total):
        self.total, self.done, self.t0 = total, 0, time.monotonic()
        self.tty = sys.stderr.isatty()

    def show(self, what):
        el = time.monotonic() - self.t0
        eta = f", ~{el / self.done * (self.total - self.done):.0f}s left" if self.done else ""
        bar = "#" * (30 * self.done // self.total)
        line = f"[{bar:<30}] {self.done}/{self.total} {what} ({el:.0f}s{eta})"
        sys.stderr.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        sys.stderr.flush()

    def step(self):
        self.done += 1

    def close(self):
        if self.tty:
            sys.stderr.write("\n")


def configs(cfg, libs):
    """(label, lib, extra env, spec additions) for every library variant to run."""
    out = []
    for lib in libs:
        if lib != "hbmcoll":
            out.append((lib, lib, ds_env() if lib == "deepspeed" else {}, {}))
            continue
        for buf, mem, bind in itertools.product(cfg["buffers"], cfg["memory"], cfg["bind"]):
            label = f"hbmcoll-{buf}" + ("" if mem == "hbm_preferred" else f"-{mem}") + (
                "" if bind == "core" else f"-bind{bind}")
            out.append((label, lib, {"HBMCOLL_MEMORY": mem, "HBMCOLL_BIND": bind},
                        {"buffers": buf, "memory": mem, "bind": bind}))
    return out


def wait_idle(limit):
    """Busy fraction of the CPUs once they are below 25% busy, or after `limit` seconds."""
    t0 = time.monotonic()
    busy = machine.busy_fraction()
    while busy is not None and busy > 0.25 and time.monotonic() - t0 < limit:
        busy = machine.busy_fraction(1.0)
    return busy


def run_task(task, raw, timeout, idle_wait=0):
    """Launch one (label, P, spec); return (rows, task record)."""
    label, lib, env_extra, spec, P, rnd = task
    tag = f"{label}.P{P}.r{rnd}"
    spec_path = os.path.join(raw, tag + ".spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    prefix = os.path.join(raw, tag)
    cmd = command(lib, P, spec_path, prefix)
    busy = wait_idle(idle_wait)
    xcore = noise.cross_core()
    snap = machine.cpu_snapshot()
    status, wall = launch(cmd, env_with(env_extra), timeout, prefix + ".log")
    if lib == "deepspeed":   # its shm segments, if a rank died before unlinking its own
        port = next(a.split("=", 1)[1] for a in cmd if a.startswith("--master_port="))
        for f in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_*"):
            os.remove(f)
    other = machine.foreign_busy(snap, machine.cpu_snapshot())
    got = report.collect(prefix, P) if status == "ok" else None
    rec = {"label": label, "library": lib, "P": P, "round": rnd, "status": status,
           "wall_s": wall, "busy_before": busy, "busy_other": other, "xcore_gbps": xcore,
           "command": " ".join(cmd), "env": env_extra, "log": prefix + ".log"}
    if status == "ok" and got is None:
        rec["status"] = "missing rank files"
    if got is None:
        return [], rec
    meta, stats = got
    rec["meta"] = meta
    topo = meta.get("topology") or {}
    common = {"busy_before": busy, "busy_other": other, "xcore_gbps": xcore, "round": rnd, "label": label,
              "library": lib, "P": P, "launcher": cmd[0],
              "variation_us": meta["variation_us"], "buffers": spec.get("buffers", "numpy"),
              "memory": spec.get("memory"), "bind": spec.get("bind"), "status": "ok",
              "topology_modes": json.dumps({k: topo[k] for k in ("memory_mode", "cluster_mode",
                                                                  "modes", "error") if k in topo},
                                           default=str) if topo else None,
              "hbm_nodes": json.dumps(topo.get("hbm_nodes"), default=str) if topo else None,
              "topology": topo or None}
    return [dict(common, **s) for s in stats], rec


def main(argv=None):
    a = args_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # unwinds through launch()
    cfg = settings(a)
    where = None
    if "hbmcoll" in a.libs:               # the library under test: it loads, or nothing runs
        where, why = hbmcoll_under_test()
        if why:
            found = f"hbmcoll at {where}" if where else f"not on the path of {sys.executable}"
            sys.exit(f"[bench] hbmcoll does not load, so nothing was run: {why} ({found}; "
                     "build it with `make build` in a checkout, or pip install it)")
        print(f"[bench] hbmcoll under test: {where}", file=sys.stderr)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    root = a.out or (os.path.join(HERE, "results") if IN_CHECKOUT
                     else os.path.abspath("hbmcoll-bench-results"))
    outdir = os.path.join(root, stamp)
    raw = os.path.join(outdir, "raw")
    os.makedirs(raw, exist_ok=True)
    t_start = time.monotonic()

    libs, skipped = [], {}
    for lib in a.libs:
        ok, why = available(lib)
        if ok:
            libs.append(lib)
        else:
            skipped[lib] = why
            print(f"[bench] {lib} skipped: {why}", file=sys.stderr)
    if not [lib for lib in libs if not lib.startswith("floor")]:
        sys.exit("[bench] no library available; see bench/README.md for the installs")

    spec0 = {"collectives": cfg["collectives"], "sizes": cfg["sizes"], "dtype": "float32",
             "llc_bytes": machine.llc_bytes(), "verbose": a.verbose,
             "mem_budget": (machine.mem_available() or 1 << 40) // 2}   # all ranks together
    if a.iters:
        spec0.update(iters_small=a.iters, skip_small=max(1, a.iters // 10))
    if a.iters_large:
        spec0.update(iters_large=a.iters_large, skip_large=max(1, a.iters_large // 10))
    confs = configs(cfg, libs)
    tasks = []
    for rnd in range(cfg["rounds"]):        # rotate the order each round: nobody always first
        k = rnd % len(confs)
        for P in cfg["np"]:
            for label, lib, env_extra, extra in confs[k:] + confs[:k]:
                tasks.append((label, lib, env_extra, dict(spec0, **extra), P, rnd))
    over = []
    if not a.no_oversub:
        spec_o = dict(spec0, collectives=["allreduce"], sizes=[8],
                      iters_small=cfg["oversub_iters"],
                      skip_small=max(1, cfg["oversub_iters"] // 10))
        over = [(label, lib, env_extra, dict(spec_o, **extra), a.oversub_np, "oversub")
                for label, lib, env_extra, extra in confs
                if lib in ("mpi4py", "openmpi") or label == "hbmcoll-numpy"]

    meta = {"run_id": stamp, "mode": cfg["mode"], "settings": cfg, "rounds": cfg["rounds"],
            "libraries": libs, "skipped": skipped, "argv": sys.argv[1:], "hbmcoll_from": where,
            "dtype": "float32", "op": "sum",
            "method": "OMB-Py: barrier, warm-up, barrier, back-to-back timed loop, barrier; "
                      "avg/min/max over ranks; data rotated among pre-filled buffers and one "
                      "word rewritten per iteration (same code for every library)",
            "fairness": {"OMP_NUM_THREADS": "1", "torch.set_num_threads": 1,
                         "torch_allreduce": "in place (gloo has no out-of-place)",
                         "deepspeed_allreduce": "in place (inference_all_reduce), a core per rank",
                         "mpi4py_allreduce": "out of place (OMB-Py)",
                         "hbmcoll_allreduce": "numpy: out=; empty: in place (zero copy)"},
            "launchers": {lib: command(lib, 2, "SPEC", "OUT")[:1] for lib in libs},
            "machine": machine.info()}
    # the limit at the start, between rounds and at the end: the machine's quiet moments
    # come and go like the libraries' (best kept, as for them)
    prog = Progress(len(tasks) + len(over) + (0 if a.no_limits else cfg["rounds"] + 1))
    prog.show("host noise")
    meta["noise"] = {"start": noise.measure()}
    lim = None
    if not a.no_limits:
        prog.show("copy bandwidth (physical limit)")
        busy = wait_idle(a.wait_idle)
        lim = L.measure(cfg["np"])
        lim["busy_before"] = busy
        prog.step()

    rows, records = [], []
    for i, t in enumerate(tasks):
        prog.show(f"round {t[5] + 1}/{cfg['rounds']} P={t[4]} {t[0]}")
        r, rec = run_task(t, raw, cfg["timeout"], a.wait_idle)
        rows += r
        records.append(rec)
        if rec["status"] != "ok":
            print(f"\n[bench] {t[0]} P={t[4]}: {rec['status']} (log: {rec['log']})",
                  file=sys.stderr)
        prog.step()
        if lim and i + 1 < len(tasks) and tasks[i + 1][5] != t[5]:
            prog.show(f"copy bandwidth (after round {t[5] + 1})")
            wait_idle(a.wait_idle)
            lim = L.merge(lim, L.measure(cfg["np"]))
            prog.step()
    oversub = []
    for t in over:
        prog.show(f"oversubscribed: {t[0]} {t[4]} ranks, {cfg['oversub_iters']} allreduces")
        r, rec = run_task(t, raw, cfg["oversub_timeout"], a.wait_idle)
        records.append(rec)
        o = {"label": t[0], "P": t[4], "cores": len(os.sched_getaffinity(0)),
             "iters": cfg["oversub_iters"], "status": rec["status"], "wall_s": rec["wall_s"],
             "timeout_s": cfg["oversub_timeout"]}
        if r:
            o.update(avg_us=r[0]["avg_us"], min_us=r[0]["min_us"], max_us=r[0]["max_us"])
        oversub.append(o)
        prog.step()
    if lim:
        prog.show("copy bandwidth again (end of run)")
        wait_idle(a.wait_idle)
        lim = L.merge(lim, L.measure(cfg["np"]))
        prog.step()
    meta["noise"]["end"] = noise.measure()
    prog.close()

    meta["tasks"] = records
    busy = [r.get(k) for r in records for k in ("busy_before", "busy_other")
            if r.get(k) is not None]
    if busy and max(busy) > 0.25:
        meta["warning"] = (f"other work kept up to {max(busy):.0%} of the CPUs busy before or "
                           "during some launches (busy_before, busy_other in rounds.csv): "
                           "numbers are noisy")
        print(f"[bench] warning: {meta['warning']}", file=sys.stderr)
    meta["wall_s"] = time.monotonic() - t_start
    summ = report.summarize(rows, lim)
    if a.no_plots:
        report.plots = lambda *x: []
    md = report.write_all(outdir, meta, rows, summ, lim, oversub)
    latest = os.path.join(root, "latest")
    try:                                      # a relative symlink; a copy where links fail
        if os.path.islink(latest) or os.path.exists(latest):
            (os.remove if os.path.islink(latest) else shutil.rmtree)(latest)
        os.symlink(stamp, latest)
    except OSError:
        shutil.copytree(outdir, latest, ignore=shutil.ignore_patterns("raw"))
    print(md)
    if a.nodes:
        across_nodes(outdir, cfg["rounds"])
    print(f"\n[bench] results in {outdir} ({meta['wall_s']:.0f} s)", file=sys.stderr)
    bad = [r for r in records if r["status"] != "ok"]
    return 1 if bad and not rows else 0


def across_nodes(outdir, rounds):
    """bench/net_bridge.py's tables (2 nodes x 1 and x 2 ranks, uncapped and at 2 Gbit) into
    nodes.md and on stdout."""
    if os.geteuid() != 0:
        print("[bench] --nodes skipped: emulated nodes (network namespaces) need root", file=sys.stderr)
        return
    if not IN_CHECKOUT:
        print("[bench] --nodes skipped: bench/net_bridge.py runs from a checkout", file=sys.stderr)
        return
    out = subprocess.run([sys.executable, os.path.join(HERE, "net_bridge.py"), "--rounds", str(min(rounds, 3))],
                         capture_output=True, text=True)
    with open(os.path.join(outdir, "nodes.md"), "w") as f:
        f.write(out.stdout)
    print(out.stdout)
    if out.returncode:
        print(f"[bench] net_bridge.py failed: {out.stderr[-800:]}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
