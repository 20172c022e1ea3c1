"""Regression tests of issue 15: each numbered defect of the adversarial pass, reproduced.

(1) two spawn-style jobs of one parent, (2, 7) fork, (3) roots beyond int, (4) two threads,
(5) NaN in min/max, (6) a squatted rendezvous name, (8) out of fds in split, (9) Ctrl-C while a
dropped request is freed, (10, 11) no default timeout, stall warnings and clean exits,
(12) bad HBMCOLL_TIMEOUT values, (13) closed after a mismatch. (14) is conftest.py and
test_launch.py's teardown.
"""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ranks

HERE = Path(__file__).resolve().parent
PYMOD = HERE.parents[1] / "pymod"


def _env(**extra):
    env = ranks.clean_env({k: v for k, v in extra.items() if v is not None})
    for k in [k for k, v in extra.items() if v is None]:
        env.pop(k, None)
    env["PYTHONPATH"] = str(PYMOD)
    env.setdefault("HBMCOLL_BIND", "none")
    env["HBMCOLL_QUIET"] = "1"
    return env


def _run_script(tmp_path, body, n, env=None, timeout=90):
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", str(n), str(prog)],
                          env=env or _env(), capture_output=True, text=True, timeout=timeout)


# ---- (1) two jobs of one parent, RANK/WORLD_SIZE only --------------------------------------

_SPAWNED = """
import sys, numpy as np, hbmcoll
try:
    c = hbmcoll.init()
except ValueError as e:
    print("refused:", e); sys.exit(0)
x = np.array([float(sys.argv[1])]); c.allreduce(x); print("sum", x[0])
"""


@pytest.mark.parametrize("with_keys", [False, True])
def test_two_spawn_style_jobs_of_one_parent(with_keys):
    procs = []
    for job, value in (("a", 0.5), ("b", 100.5)):
        for r in range(2):
            extra = dict(RANK=str(r), WORLD_SIZE="2")
            if with_keys:
                extra["HBMCOLL_JOB_KEY"] = f"secret-{job}-{os.getpid()}"
            procs.append((job, subprocess.Popen([sys.executable, "-c", _SPAWNED, str(value)],
                                                env=_env(**extra), stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True)))
    outs = [(job, p.communicate(timeout=60)[0]) for job, p in procs]
    for job, out in outs:
        if with_keys:
            assert f"sum {1.0 if job == 'a' else 201.0}" in out, out
        else:  # never a mixed group: every rank is told what to set
            assert "refused:" in out and "HBMCOLL_JOB_KEY" in out, out


# ---- (2, 7) a fork()ed child --------------------------------------------------------------

def test_forked_child_cannot_use_or_break_the_parents_communicator(tmp_path):
    res = _run_script(tmp_path, """
        import os, sys, numpy as np, hbmcoll
        c = hbmcoll.init()
        pid = os.fork()
        if pid == 0:
            try:
                c.allreduce(np.ones(4))
                print("child: no error"); sys.exit(3)
            except hbmcoll.Error as e:
                sys.stdout.write(f"child: {e}\\n")
            sys.exit(0)  # a normal interpreter exit: deallocates c in the child
        assert os.waitpid(pid, 0)[1] == 0
        x = np.full(4, c.rank + 1.0); c.allreduce(x)
        sys.stdout.write(f"parent {c.rank} {x[0]}\\n")  # one write: the ranks share the pipe
        """, 2)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("a fork()ed child") == 2, res.stdout
    assert res.stdout.count(" 3.0") == 2, res.stdout  # 1 + 2, parents only


# ---- (3) roots beyond int -----------------------------------------------------------------

@pytest.mark.parametrize("root", [2**32 + 1, 2**31, 2**63, 2**64 + 1, -1, -2**32])
def test_roots_are_checked_before_narrowing(comm1, root):
    buf = np.zeros(3)
    for call in (lambda: comm1.bcast(buf, root=root), lambda: comm1.ibcast(buf, root=root),
                 lambda: comm1.reduce(buf, root=root), lambda: comm1.gather(buf, root=root),
                 lambda: comm1.scatter(np.zeros((1, 3)), root=root)):
        with pytest.raises(ValueError, match="not a rank"):
            call()
    comm1.bcast(buf, root=0)  # still usable


def _root_beyond_int(comm):
    buf = np.full(2, float(comm.rank))
    try:
        comm.bcast(buf, root=2**32 + 1)  # narrowed to int, this was rank 1
        return "no error", buf.tolist()
    except ValueError as e:
        comm.barrier()  # nothing was communicated: the communicator is still in step
        return "ValueError", str(e)


def test_root_beyond_int_is_not_rank_1(run_ranks):
    for kind, detail in run_ranks(2, _root_beyond_int):
        assert kind == "ValueError" and "4294967297" in detail, detail


# ---- (4) two threads on one communicator --------------------------------------------------

def _two_threads(comm):
    errors, results = [], []

    def worker(value):
        try:
            for _ in range(50):
                x = np.array([value])
                comm.allreduce(x)
                results.append(x[0])
        except Exception as e:  # noqa: BLE001 - the test reports it
            errors.append(f"{type(e).__name__}: {e}")

    t = threading.Thread(target=worker, args=(1000.0,))
    t.start()
    worker(1.0)  # the creating thread: allowed
    t.join()
    # handing over explicitly works
    out = []
    t = threading.Thread(target=lambda: (comm.bind_thread(), out.append(comm.allreduce(np.ones(1)))))
    comm.barrier()
    t.start()
    t.join()
    return errors, sorted(set(results)), float(out[0][0])


def test_second_thread_is_refused_at_once(run_ranks):
    for errors, results, handed in run_ranks(2, _two_threads):
        assert len(errors) == 1 and "thread" in errors[0] and "Error" in errors[0], errors
        assert results == [2.0]  # only the owner's 1.0 + 1.0: never 1001
        assert handed == 2.0


# ---- (5) NaN from any rank ----------------------------------------------------------------

def _nan_minmax(comm, dtype, algo, n):
    comm.set_algorithm("allreduce", algo)
    comm.set_algorithm("reduce", algo)
    out = {}
    for op in ("min", "max"):
        x = np.arange(n, dtype=np.float64) + comm.rank
        x[n // 2] = np.nan if comm.rank == comm.size - 1 else x[n // 2]
        x[0] = np.nan if comm.rank == 1 else x[0]
        x = x.astype(dtype)
        out[op] = comm.allreduce(x.copy(), op=op)
        r = comm.reduce(x.copy(), op=op, root=0)
        if comm.rank == 0:
            out["reduce_" + op] = r
        rs = comm.reduce_scatter(np.tile(x, (comm.size, 1)), op=op)
        out["rs_" + op] = rs
    return {k: np.isnan(v.astype(np.float64)).nonzero()[0].tolist() for k, v in out.items()}


@pytest.mark.parametrize("P", [2, 3])
@pytest.mark.parametrize("algo", ["flat", "rsag"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_nan_propagates_from_any_rank(run_ranks, P, algo, dtype):
    n = 4099
    for got in run_ranks(P, _nan_minmax, dtype, algo, n):
        for key, where in got.items():
            assert where == [0, n // 2], (key, where[:5])


def _nan_bf16(comm):
    import torch
    x = torch.arange(8, dtype=torch.bfloat16)
    if comm.rank == 1:
        x[3] = float("nan")
    y = comm.allreduce(x.clone(), op="max")
    return torch.isnan(y.float()).nonzero().flatten().tolist()


def test_nan_propagates_bfloat16(run_ranks):
    pytest.importorskip("torch")
    assert run_ranks(2, _nan_bf16) == [[3], [3]]


# ---- (6) a squatted, predictable rendezvous name ------------------------------------------

def _fnv1a(text):
    h = 1469598103934665603
    for b in text.encode():
        h = ((h ^ b) * 1099511628211) % 2**64
    return h


def test_squatted_old_style_name_does_not_stop_a_job(tmp_path):
    """The name the launcher's variables alone used to give (hydra: the proxy's pid) is bound
    first by another user; the job must start anyway, since names now hold a secret."""
    key = f"u{os.getuid()}.mpiexec.{os.getpid()}/w1"
    name = f"\0hbmcoll.{os.getuid()}.{_fnv1a(key):016x}"
    squatter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, socket, time
        os.setgid(65534); os.setuid(65534)
        s = socket.socket(socket.AF_UNIX); s.bind({name!r}); s.listen(8)
        print("bound", flush=True); time.sleep(60)""")], stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "bound"
        procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
            import numpy as np, hbmcoll
            c = hbmcoll.init(); x = np.ones(2); c.allreduce(x); print("sum", x[0])""")],
            env=_env(PMI_RANK=str(r), PMI_SIZE="2", PMI_FD="9", MPI_LOCALRANKID=str(r),
                     MPI_LOCALNRANKS="2"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True) for r in range(2)]
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert all("sum 2.0" in o for o in outs), outs
    finally:
        squatter.kill()
        squatter.wait()
    # the private directory holds nothing once the ranks have met
    from hbmcoll.launch import job_secret
    d = Path(job_secret.private_dir())
    assert (d.stat().st_mode & 0o077) == 0
    assert not [f for f in d.iterdir() if f.name.startswith("job-")]


def test_squatted_private_directory_costs_a_line_not_the_job(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to make a directory owned by another user")
    squatted = tmp_path / f"hbmcoll-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, 65534, 65534)
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import numpy as np, hbmcoll
        c = hbmcoll.init(); x = np.ones(2); c.allreduce(x); print("sum", x[0])""")],
        env=_env(PMI_RANK=str(r), PMI_SIZE="2", PMI_FD="9", MPI_LOCALRANKID=str(r),
                 MPI_LOCALNRANKS="2", TMPDIR=str(tmp_path), XDG_RUNTIME_DIR=None),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all("sum 2.0" in o for o in outs), outs
    assert any(f"the rendezvous uses {squatted}.1" in o for o in outs), outs
    assert not list(squatted.iterdir())


def _lone_member(**env):
    """Local rank 1 of 2 with no rank 0 and HBMCOLL_TIMEOUT=1: what it prints."""
    code = textwrap.dedent("""
        import hbmcoll
        try:
            hbmcoll.init()
        except TimeoutError as e:
            print("timeout:", e)""")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=_env(PMI_RANK="1", PMI_SIZE="2", PMI_FD="9", MPI_LOCALRANKID="1",
                                  MPI_LOCALNRANKS="2", HBMCOLL_TIMEOUT="1", **env))
    return res.stdout + res.stderr


def test_member_without_rank_0_honours_the_timeout():
    out = _lone_member()
    assert "timeout: local rank 1 found no rank 0" in out, out


def test_the_job_key_is_a_secret_errors_never_show():
    # HBMCOLL_JOB_KEY joins nodes (the proofs of nodes_meet.c are keyed with it): a timeout's
    # message, which lands in batch logs, counts its characters instead
    secret = "s3cr3t-job-key-7f21"
    out = _lone_member(HBMCOLL_JOB_KEY=secret)
    assert f"key.<HBMCOLL_JOB_KEY, {len(secret)} characters>/" in out, out
    assert secret not in out, out


# ---- (8) out of fds in split --------------------------------------------------------------

def _split_without_fds(comm):
    import resource
    if comm.rank == 0:
        open_now = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 2, resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))
    try:
        comm.split(0)
        return "no error"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def test_out_of_fds_in_split_ends_at_once_with_the_cause(run_ranks):
    got = run_ranks(3, _split_without_fds, env={"HBMCOLL_TIMEOUT": None}, timeout=60)
    assert "accept: Too many open files" in got[0], got
    assert all(g.startswith(("Error: ", "BootstrapError: ")) for g in got), got  # every rank told, none waits on


# ---- (9) Ctrl-C while a dropped request is freed ------------------------------------------

def _drop_request(comm):
    if comm.rank == 0:
        req = comm.iallreduce(np.ones(8))
        ranks.event("dropping")
        t0 = time.monotonic()
        try:
            del req  # rank 1 never joins: this waits, but Ctrl-C must end it
            time.sleep(5)
            return "not interrupted"
        except KeyboardInterrupt:
            return f"interrupted after {time.monotonic() - t0:.1f} s"
    ranks.event("dropping")
    time.sleep(30)
    return "slept"


def test_ctrl_c_while_a_dropped_request_is_freed(start_ranks):
    job = start_ranks(2, _drop_request, env={"HBMCOLL_TIMEOUT": None}, timeout=60)
    job.wait_event(0, "dropping")
    time.sleep(0.5)
    job.signal(0, signal.SIGINT)
    res = job.join(40)
    assert res[0].status == "ok" and res[0].value.startswith("interrupted"), job.report()


# ---- (10, 11) no hard timeout by default; stalls warn; clean exits are named ---------------

def _slow_peer(comm):
    if comm.rank == 1:
        time.sleep(3.5)  # a checkpoint: longer than the stall warning
    x = np.ones(4)
    comm.allreduce(x)
    return float(x[0])


def test_slow_peer_warns_but_is_not_killed(start_ranks):
    job = start_ranks(2, _slow_peer, env={"HBMCOLL_TIMEOUT": None, "HBMCOLL_STALL_WARN": "1"})
    res = job.join(60)
    assert [r.value for r in res] == [2.0, 2.0], job.report()
    out = res[0].output
    assert "rank 0 has waited" in out and "allreduce (collective #1)" in out, out
    assert "not there yet: 1" in out and out.count("has waited") >= 2, out  # 1 s, 2 s: back-off


def _leave_early(comm):
    comm.barrier()
    if comm.rank == 1:
        return "left"  # returns: ranks.py deletes nothing, so close like an exiting program
    try:
        comm.allreduce(np.ones(2))
        return "no error"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def _close_then_return(comm):
    r = _leave_early(comm)
    if comm.rank == 1:
        comm.close()
    return r


def test_clean_exit_is_named_as_such(run_ranks):
    got = run_ranks(2, _close_then_return, env={"HBMCOLL_TIMEOUT": None})
    assert got[0].startswith("PeerLostError") and "before collective #2 (allreduce)" in got[0], got
    assert "died" not in got[0]


@pytest.mark.parametrize("value", ["0", "-5", "nan", "abc", "inf"])
def test_bad_timeout_value_names_the_variable(value):
    code = "import hbmcoll; hbmcoll.init()"
    res = subprocess.run([sys.executable, "-c", code], env=_env(HBMCOLL_TIMEOUT=value),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "HBMCOLL_TIMEOUT" in res.stderr, res.stderr
    assert "ArgumentError" in res.stderr and "could not convert" not in res.stderr


@pytest.mark.parametrize("var, value", [("HBMCOLL_SPIN", "abc"), ("HBMCOLL_SLOT_BYTES", "12Q"),
                                        ("HBMCOLL_ALGO", "allreduce=fast"),
                                        ("HBMCOLL_STALL_WARN", "-1"), ("HBMCOLL_CMA", "yes")])
def test_bad_tunable_names_the_variable(var, value):
    res = subprocess.run([sys.executable, "-c", "import hbmcoll; hbmcoll.init()"],
                         env=_env(**{var: value}), capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and var in res.stderr and "ArgumentError" in res.stderr, res.stderr


# ---- (13) closed for good after a mismatch ------------------------------------------------

def _mismatch_then_closed(comm):
    import hbmcoll
    try:
        comm.allreduce(np.ones(2 + comm.rank))
    except hbmcoll.MismatchError:
        pass
    closed = comm.closed
    try:
        hbmcoll.empty(4, comm=comm)
        allocated = True
    except hbmcoll.Error:
        allocated = False
    return closed, allocated


def test_closed_after_mismatch(run_ranks):
    assert run_ranks(2, _mismatch_then_closed) == [(True, False)] * 2
