"""DeepSpeed worker: DeepSpeed's shared-memory CPU allreduce, run as its CPU docs launch a job:

    DS_ACCELERATOR=cpu deepspeed --num_accelerators P --bind_cores_to_rank --no_local_rank \
        --master_addr 127.0.0.1 --master_port PORT deepspeed_worker.py SPEC OUT

`deepspeed.comm.inference_all_reduce(tensor)` is the call that takes the shm op
(ShareMemCommBuilder: csrc/cpu/comm/shm.cpp, JIT-built with ninja); `deepspeed.comm.all_reduce`
is torch.distributed's gloo, which the `torch` peer measures already. So this worker measures
allreduce only (DeepSpeed has no shm broadcast or gather: those are gloo's too) and reports the
other collectives as not supported. The shm allreduce is in place, sum only, float32 (AVX2),
bf16/fp16 (AVX-512BW); buffers go through shared memory in 32 MiB chunks, below 1 MiB each
rank reduces all the inputs, from 1 MiB each reduces its slice and copies the others' back.

It falls back without a word: to gloo where the CPU lacks the ISA (`shm_vector_kernel_level`),
and to nothing at all (the tensor left as it was) for other dtypes, other ops (summed) and
non-contiguous tensors. So the worker checks the shm op is the one that runs and checks every
size's result against the sum of the ranks' data before timing it, and stops if not.

The op keeps a /dev/shm segment per rank (66 MiB) that DeepSpeed never removes: each rank
unlinks its own once every rank has mapped it. `python deepspeed_worker.py --check` builds or
loads the op and says whether this machine takes the shm path (`make deepspeed-peer`, the suite).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def shm_op():
    """(the loaded shm op module, its vector kernel level), building it on first use (ninja,
    about 30 s on 2 cores; TORCH_EXTENSIONS_DIR keeps it). Exits with one line if it cannot."""
    try:
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator
    except ImportError as e:
        sys.exit(f"DeepSpeed does not import in {sys.executable} ({e}): `make deepspeed-peer` "
                 "installs it")
    acc = get_accelerator()
    if acc.device_name() != "cpu":
        sys.exit(f"DeepSpeed chose the {acc.device_name()} accelerator, not cpu (DS_ACCELERATOR=cpu)")
    builder = acc.create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        sys.exit("DeepSpeed's shm op (ShareMemCommBuilder) is not available for this platform")
    try:
        mod = builder.load(verbose=False)
    except Exception as e:  # noqa: BLE001 - a compiler's or ninja's error, whatever its type
        sys.exit(f"DeepSpeed's shm op does not build: {str(e).splitlines()[0][:200]}")
    level = mod.vector_kernel_level()
    if level < 1:
        sys.exit("this CPU has no AVX2: DeepSpeed's inference_all_reduce falls back to gloo here")
    return mod, level


def check():
    mod, level = shm_op()
    import deepspeed
    print(f"DeepSpeed {deepspeed.__version__}: shm op {mod.__file__}, vector kernel level {level}")


def main():
    import numpy as np
    import torch
    import deepspeed
    import deepspeed.comm as dist

    import common as C

    spec, out = C.load_spec()
    torch.set_num_threads(1)
    shm_op()                       # loaded (or built) before init, with a clear line if not
    deepspeed.init_distributed()   # as its users call it: gloo for the rest, shm op built
    rank, P = dist.get_rank(), dist.get_world_size()
    cdb = deepspeed.comm.comm.cdb
    # inference_all_reduce takes the shm op only when all of these hold; otherwise it is gloo
    # (or, with LOCAL_SIZE != world size, a crash on the unmapped segments)
    why = [w for w, bad in (
        ("the backend built no shm op", getattr(cdb, "shm_comm_op", None) is None),
        ("torch.ops.deepspeed.inference_all_reduce_ is not registered",
         not hasattr(torch.ops.deepspeed, "inference_all_reduce_")),
        ("no AVX2 (shm_vector_kernel_level < 1)", getattr(cdb, "shm_vector_kernel_level", 0) < 1),
        (f"LOCAL_SIZE={os.environ.get('LOCAL_SIZE')} is not the world size {P} (the deepspeed "
         "launcher sets it)", os.environ.get("LOCAL_SIZE") != str(P))) if bad]
    if why:
        sys.exit(f"[deepspeed] rank {rank}: the shm path would not run: {'; '.join(why)}")
    dist.barrier()                 # every rank has mapped every segment: unlink ours
    seg = (f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{os.environ['MASTER_ADDR']}_"
           f"{os.environ['MASTER_PORT']}_{rank}")
    if os.path.exists(seg):
        os.unlink(seg)

    def build(coll, size, nbuf):
        if coll != "allreduce":    # no shm path: DeepSpeed's broadcast, gather, ... are gloo's
            return None
        n = C.count(size)
        arrs = [C.filled(n, rank + k) for k in range(nbuf)]
        s = [torch.from_numpy(a) for a in arrs]
        dist.inference_all_reduce(s[0])            # checked once, then filled again
        want = sum(C.filled(n, q) for q in range(P))
        wrong = ~np.isclose(arrs[0], want, rtol=1e-6, atol=0)   # summation order aside
        if wrong.any():
            bad = int(np.flatnonzero(wrong)[0])
            sys.exit(f"[deepspeed] rank {rank}: inference_all_reduce of {size} B is wrong: "
                     f"element {bad} is {arrs[0][bad]}, the sum is {want[bad]}")
        arrs[0][:] = C.filled(n, rank)
        return (lambda k: dist.inference_all_reduce(s[k])), arrs   # in place, like gloo's

    def barrier():
        dist.barrier()

    def progress(done, total):
        print(f"[deepspeed] {done}/{total} collectives", file=sys.stderr, flush=True)

    rows = C.run_all(spec, rank, P, barrier, build, progress if spec.get("verbose") else None)
    meta = {"library": "deepspeed", "deepspeed_version": deepspeed.__version__,
            "call": "deepspeed.comm.inference_all_reduce (shm op, in place)",
            "shm_op": cdb.shm_comm_op.__file__,
            "shm_vector_kernel_level": cdb.shm_vector_kernel_level,
            "backend": type(cdb).__name__ + "/" + torch.distributed.get_backend(),
            "torch_version": torch.__version__, "torch_num_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "LOCAL_SIZE": os.environ.get("LOCAL_SIZE"),
            "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR"),
            "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"}
    C.write_rank(out, rank, P, meta, rows)
    dist.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    check() if sys.argv[1:] == ["--check"] else main()
