"""The secret of a job across nodes, drawn by the job and carried by its launcher's store.

Under torchrun, every rank reaches the store its agents keep at MASTER_ADDR:MASTER_PORT
(TORCHELASTIC_USE_AGENT_STORE=True): the first rank there draws 32 random bytes and sets them under
the run's id, the others read them, so `torchrun --nnodes N ...` needs no HBMCOLL_JOB_KEY. That
secret is as protected as torch's store is: whoever can reach that port can read it, as they can
read all that torch keeps there. HBMCOLL_JOB_KEY, the same on every node, is for stronger setups,
and for the launchers without such a store (srun, mpiexec, hbmcoll-run).
"""
import secrets


def from_store(env, timeout):
    """The job's secret through torchrun's store, or None where there is none."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not env.get("MASTER_ADDR") or not env.get("MASTER_PORT"):
        return None
    try:
        from datetime import timedelta

        import torch.distributed as dist
    except ImportError:
        return None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=timeout))
    name = f"hbmcoll/job-secret/{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    # the first rank's draw stands: compare_set sets it only where nothing is, and returns what is
    return store.compare_set(name, "", secrets.token_hex(32)).decode()
