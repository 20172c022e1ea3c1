"""torch.distributed (gloo) worker: run as
`torchrun --nproc-per-node P --master-addr 127.0.0.1 --master-port PORT torch_worker.py SPEC OUT`.

What a PyTorch user on CPU gets: `init_process_group("gloo")`, in-place `all_reduce`/`broadcast`/
`reduce`, list-based `gather`/`all_gather`, `reduce_scatter_tensor`, `all_to_all_single`.
Tensors wrap NumPy arrays (torch.from_numpy), so the per-iteration touch is the same NumPy
write as for the other libraries. One intra-op thread (OMP_NUM_THREADS=1, set_num_threads(1))
for fairness; recorded in the metadata.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import common as C  # noqa: E402


def main():
    spec, out = C.load_spec()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, P = dist.get_rank(), dist.get_world_size()
    SUM = dist.ReduceOp.SUM

    def tensors(shape, nbuf, fill=True):
        arrs = [C.filled(shape, rank + k) if fill else C.output(shape)
                for k in range(nbuf)]
        return [torch.from_numpy(a) for a in arrs], [a.reshape(-1) for a in arrs]

    def build(coll, size, nbuf):
        n = C.count(size)
        if coll == "barrier":
            return (lambda k: dist.barrier()), [np.zeros(1, C.DTYPE)]
        s, touch = tensors(n, nbuf)
        if coll == "allreduce":       # gloo's all_reduce is in place only
            op = lambda k: dist.all_reduce(s[k], SUM)  # noqa: E731
        elif coll == "bcast":
            op = lambda k: dist.broadcast(s[k], 0)  # noqa: E731
        elif coll == "reduce":
            op = lambda k: dist.reduce(s[k], 0, SUM)  # noqa: E731
        elif coll == "gather":        # root passes a list of P output tensors
            r = [list(torch.zeros((P, n)).unbind(0)) if rank == 0 else None
                 for _ in range(nbuf)]
            op = lambda k: dist.gather(s[k], r[k], 0)  # noqa: E731
        elif coll == "allgather":     # the tensor form users call for flat buffers
            r = [torch.zeros(P * n) for _ in range(nbuf)]
            op = lambda k: dist.all_gather_into_tensor(r[k], s[k])  # noqa: E731
        elif coll == "reduce_scatter":
            r = [torch.zeros(n // P) for _ in range(nbuf)]
            s = [x[: (n // P) * P] for x in s]
            op = lambda k: dist.reduce_scatter_tensor(r[k], s[k], SUM)  # noqa: E731
        elif coll == "alltoall":
            s, touch = tensors(P * n, nbuf)
            r = [torch.zeros(P * n) for _ in range(nbuf)]
            op = lambda k: dist.all_to_all_single(r[k], s[k])  # noqa: E731
        else:
            return None
        try:                          # gloo lacks some collectives in some versions: probe once
            op(0)
        except (RuntimeError, NotImplementedError, ValueError) as e:
            if rank == 0:
                print(f"[torch] {coll}: {str(e).splitlines()[0][:120]}", file=sys.stderr)
            return None
        return op, touch

    def barrier():
        dist.barrier()

    def progress(done, total):
        print(f"[torch] {done}/{total} collectives", file=sys.stderr, flush=True)

    rows = C.run_all(spec, rank, P, barrier, build, progress if spec.get("verbose") else None)
    meta = {"library": "torch", "backend": dist.get_backend(), "torch_version": torch.__version__,
            "torch_num_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME"),
            "local_rank": os.environ.get("LOCAL_RANK"),
            "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"}
    C.write_rank(out, rank, P, meta, rows)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
