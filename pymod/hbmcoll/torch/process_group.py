"""The hbmcoll backend's process group for torch.distributed, in pure Python (backend.py makes
and registers it).

How it plugs in (torch 2.13): ``dist.Backend.register_backend(name, creator, devices=["cpu"])``;
``init_process_group``/``new_group`` call ``creator(prefix_store, group_rank, group_size,
timeout)`` on the members of the new group, and because the creator returns a Python subclass of
``dist.ProcessGroup``, that object *is* the process group: ``dist.all_reduce`` & co. call its
methods directly, and C++ callers (DDP's reducer, ``_broadcast_coalesced``,
``verify_params_across_processes``) reach the same methods through torch's PyProcessGroup
trampoline. Each method turns the tensors into buffers hbmcoll takes without a copy (contiguous
CPU tensors, via ``__dlpack__``), runs the collective, and returns a ``Work``:

- ``async_op=False`` (``opts.asyncOp`` false): the collective runs right here (the GIL is released
  while it runs); the returned Work is already complete.
- ``async_op=True`` and every call from C++ (DDP): the i-variant starts it on hbmcoll's progress
  thread. ``work.wait()`` finishes it in the caller's thread (copying results back where a
  temporary was needed); once someone asks for ``work.get_future()`` (DDP's reducer and comm
  hooks chain on it), the group's completer threads complete that future without anyone calling
  wait().
- Except when the process may run on one CPU only (a rank whose share is one core, as with 2 ranks on 2 cores):
  nothing can overlap with the collective there, so async collectives run in the caller's
  thread too and return a completed Work (``HBMCOLL_TORCH_INLINE=0/1`` overrides the choice).

Anything hbmcoll does not do natively is adapted here: non-contiguous tensors (copy to a
contiguous temporary, copy back), dtypes outside its set (bool, int16, uint16/32/64, complex,
float8: data movement as raw bytes; reductions on a widened or reinterpreted copy), BAND/BOR/BXOR
(gather, then fold locally), PREMUL_SUM (scale, then sum), list-of-tensors outputs (one flat
temporary, then copies), and uneven all_to_all splits (padded to the largest block).
"""
import os
import threading

import torch
import torch.distributed as dist

from .. import p2p as _p2p
from ..errors import ArgumentError
from .tensors import (_NATIVE, _OPS, _R, _RedPlan, _copy_into, _flat_cat, _flat_mv,
                      _inout, _out_buf, _plain, _unit_count)
from .work import Done, Work, _Completer, _RecvWork

BACKEND = "hbmcoll"


def env_switch(name):
    """An HBMCOLL_* switch: True (1, yes, true, on), False (0, no, false, off), or None (unset,
    auto); anything else is an error on every rank."""
    raw = os.environ.get(name, "")
    v = raw.strip().lower()
    if v in ("1", "yes", "true", "on"):
        return True
    if v in ("0", "no", "false", "off"):
        return False
    if v not in ("", "auto"):
        raise ArgumentError(f"{name}={raw!r} is not valid: one of 1, 0, auto")
    return None


def _inline_policy():
    """Run async collectives in the caller's thread? HBMCOLL_TORCH_INLINE=1/0; by default
    (auto) yes when this process may run on one CPU only (a share of one core): then
    nothing can overlap with the collective, and handing it to hbmcoll's progress thread and
    back only adds context switches on that CPU."""
    chosen = env_switch("HBMCOLL_TORCH_INLINE")
    if chosen is not None:
        return chosen
    try:
        return len(os.sched_getaffinity(0)) == 1
    except (AttributeError, OSError):
        return False


# ---- the process group ---------------------------------------------------------------------------

class ProcessGroupHbmcoll(dist.ProcessGroup):
    """torch.distributed process group over an hbmcoll Communicator (CPU tensors)."""

    def __init__(self, comm, rank=None, size=None):
        super().__init__(comm.rank if rank is None else rank, comm.size if size is None else size)
        self.comm = comm
        self._rank = comm.rank
        self._size = comm.size
        self._completer = None
        self._lock = threading.Lock()
        self._inline = _inline_policy()
        self._group_name = self._group_desc = ""

    # -- identity
    def getBackendName(self):
        return BACKEND

    def getRank(self):
        return self._rank

    def getSize(self):
        return self._size

    # torch keeps these on the backends of a C++ ProcessGroup; this one has none
    def setGroupName(self, name):
        self._group_name = name

    def getGroupName(self):
        return self._group_name

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def getGroupDesc(self):
        return self._group_desc

    def __repr__(self):
        return f"<ProcessGroupHbmcoll rank {self._rank} of {self._size}>"

    # -- plumbing
    def _start(self, req, finish, result):
        return Work(req, finish, result, self)

    def _enqueue(self, w):
        c = self._completer
        if c is None:
            with self._lock:
                if self._completer is None:
                    self._completer = _Completer(f"hbmcoll-torch-{self._rank}")
                c = self._completer
        c.put(w)

    def _go(self, opts, name, args, finish, result):
        """Run comm.<name>(*args) now (asyncOp false) or start comm.i<name>(*args)."""
        c = self.comm
        if self._inline or (opts is not None and not opts.asyncOp):
            getattr(c, name)(*args)
            if finish is not None:
                finish()
            return Done(result)
        return self._start(getattr(c, "i" + name)(*args), finish, result)

    def _one(self, tensors, what):
        if len(tensors) != 1:
            raise ArgumentError(f"hbmcoll: {what} takes one tensor per process, got {len(tensors)}")
        t = tensors[0]
        if t.device.type != "cpu":
            raise ArgumentError(f"hbmcoll: {what} needs CPU tensors, got one on {t.device}")
        return t

    # -- collectives
    def allreduce(self, tensors, opts=None):
        t = tensors[0] if len(tensors) == 1 else self._one(tensors, "allreduce")
        redop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        op = _OPS.get(getattr(redop, "op", redop))
        if op is not None and t.dtype in _NATIVE and t.is_contiguous() and not t.requires_grad \
                and t.device.type == "cpu":
            # the common case: in place on the caller's tensor, nothing to copy
            w = self._allreduce_native(t, op, tensors, opts)
            return Done(tensors) if w is None else w
        self._one(tensors, "allreduce")
        return self._reduce_general(opts, t, tensors, redop)

    def _allreduce_native(self, t, op, result, opts=None):
        """hbmcoll's allreduce in place on t, a tensor it takes as it is: run now (returns
        None) or started (returns its Work, whose value is result). DDP's comm hook calls
        this too (ddp.py)."""
        if self._inline or (opts is not None and not opts.asyncOp):
            self.comm.allreduce(t, op)
            return None
        return self._start(self.comm.iallreduce(t, op), None, result)

    def _reduce_general(self, opts, t, tensors, redop, root=None):
        plan = _RedPlan(t.dtype, redop)
        buf = plan.to_work(t)
        if plan.fold is None:
            if root is None:
                args, name = (buf, plan.op), "allreduce"
            else:
                args, name = (buf, plan.op, root), "reduce"
            same = buf.data_ptr() == _plain(t).data_ptr() and plan.mode != "cast" \
                and _plain(t).is_contiguous()
            if same or (root is not None and self._rank != root):
                finish = None
            else:
                def finish():
                    plan.store(t, buf)
            return self._go(opts, name, args, finish, tensors)
        if root is None:
            out = torch.empty((self._size,) + tuple(buf.shape), dtype=buf.dtype)

            def finish():
                plan.store(t, plan.fold_rows(out))
            return self._go(opts, "allgather", (buf, out), finish, tensors)
        if self._rank == root:
            out = torch.empty((self._size,) + tuple(buf.shape), dtype=buf.dtype)

            def finish():
                plan.store(t, plan.fold_rows(out))
            return self._go(opts, "gather", (buf, root, out), finish, tensors)
        return self._go(opts, "gather", (buf, root), None, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        if not tensors:
            return Done(tensors)
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise ArgumentError("hbmcoll: allreduce_coalesced needs tensors of one dtype")
        plan = _RedPlan(tensors[0].dtype, opts.reduceOp if opts is not None else _R.SUM)
        flat = torch.cat([plan.to_work(t).reshape(-1) for t in tensors])

        def finish():
            off = 0
            for t in tensors:
                n = t.numel() * (2 if plan.mode == "complex" else 1)
                plan.store(t, flat[off:off + n])
                off += n
        if plan.fold is not None:
            out = torch.empty((self._size, flat.numel()), dtype=flat.dtype)

            def fold_finish():
                flat.copy_(plan.fold_rows(out))
                finish()
            return self._go(opts, "allgather", (flat, out), fold_finish, tensors)
        return self._go(opts, "allreduce", (flat, plan.op), finish, tensors)

    def reduce(self, tensors, opts=None):
        t = self._one(tensors, "reduce")
        root = opts.rootRank if opts is not None else 0
        redop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._reduce_general(opts, t, tensors, redop, root=root)

    def broadcast(self, tensors, opts=None):
        t = self._one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        buf, finish = _inout(t)
        return self._go(opts, "bcast", (buf, root), finish if self._rank != root else None,
                        tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        t = self._one(input_tensors, "allgather")
        if len(output_tensors) != 1:
            raise ArgumentError("hbmcoll: allgather takes one output list per process")
        outs = output_tensors[0]
        self._check_list(outs, t, "allgather output")
        src = _flat_mv(t)
        n = src.numel()
        tmp = torch.empty(self._size * n, dtype=src.dtype)

        def finish():
            for i, o in enumerate(outs):
                _copy_into(o, tmp[i * n:(i + 1) * n])
        return self._go(opts, "allgather", (src, tmp), finish, output_tensors)

    def all_gather_single(self, output, input, opts=None):
        if output.numel() != input.numel() * self._size or output.dtype != input.dtype:
            raise ArgumentError(f"hbmcoll: all_gather_into_tensor: output must be {self._size} x "
                             f"input of the same dtype")
        src = _flat_mv(input)
        out, finish = _out_buf(output)
        return self._go(opts, "allgather", (src, out), finish, [output])

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        works = [self.allgather([outs], [t], opts) for outs, t in zip(output_lists, input_tensors)]
        for w in works:
            w.wait()
        return Done(output_lists)

    def gather(self, output_tensors, input_tensors, opts=None):
        t = self._one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        src = _flat_mv(t)
        if self._rank != root:
            return self._go(opts, "gather", (src, root), None, output_tensors)
        if len(output_tensors) != 1:
            raise ArgumentError("hbmcoll: gather takes one output list on the root")
        outs = output_tensors[0]
        self._check_list(outs, t, "gather output")
        n = src.numel()
        tmp = torch.empty(self._size * n, dtype=src.dtype)

        def finish():
            for i, o in enumerate(outs):
                _copy_into(o, tmp[i * n:(i + 1) * n])
        return self._go(opts, "gather", (src, root, tmp), finish, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        t = self._one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        out, finish = _out_buf(t)
        if self._rank == root:
            if len(input_tensors) != 1:
                raise ArgumentError("hbmcoll: scatter takes one input list on the root")
            ins = input_tensors[0]
            self._check_list(ins, t, "scatter input")
            src = _flat_cat(ins)
        else:
            src = None
        return self._go(opts, "scatter", (src, root, out), finish, output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        t = self._one(output_tensors, "reduce_scatter")
        if len(input_tensors) != 1:
            raise ArgumentError("hbmcoll: reduce_scatter takes one input list per process")
        ins = input_tensors[0]
        self._check_list(ins, t, "reduce_scatter input")
        redop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        plan = _RedPlan(t.dtype, redop)
        src = torch.cat([plan.to_work(x).reshape(-1) for x in ins])
        return self._reduce_scatter(opts, plan, src, t, output_tensors)

    def reduce_scatter_single(self, output, input, opts=None):
        if input.numel() != output.numel() * self._size or output.dtype != input.dtype:
            raise ArgumentError(f"hbmcoll: reduce_scatter_tensor: input must be {self._size} x "
                             f"output of the same dtype")
        redop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        plan = _RedPlan(output.dtype, redop)
        src = plan.to_work(input).reshape(-1)
        return self._reduce_scatter(opts, plan, src, output, [output])

    _reduce_scatter_base = reduce_scatter_single

    def _reduce_scatter(self, opts, plan, src, t, result):
        n = src.numel() // self._size
        if plan.fold is not None:
            got = torch.empty_like(src)

            def finish():
                plan.store(t, plan.fold_rows(got.view(self._size, n)))
            return self._go(opts, "alltoall", (src, got), finish, result)
        p = _plain(t)
        if plan.mode is None and p.is_contiguous():
            return self._go(opts, "reduce_scatter", (src, plan.op, p.view(-1)), None, result)
        out = torch.empty(n, dtype=src.dtype)
        return self._go(opts, "reduce_scatter", (src, plan.op, out),
                        lambda: plan.store(t, out), result)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        P = self._size
        if len(output_tensors) != P or len(input_tensors) != P:
            raise ArgumentError(f"hbmcoll: all_to_all needs {P} input and {P} output tensors")
        dt = input_tensors[0].dtype
        if any(x.dtype != dt for x in list(input_tensors) + list(output_tensors)):
            raise ArgumentError("hbmcoll: all_to_all needs tensors of one dtype")
        send = [_flat_mv(x).reshape(-1) for x in input_tensors]
        recv_counts = [_unit_count(o) for o in output_tensors]

        def store(j, chunk):
            _copy_into(output_tensors[j], chunk)
        return self._alltoallv(opts, send, recv_counts, store, output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        P = self._size
        if output.dtype != input.dtype:
            raise ArgumentError("hbmcoll: all_to_all_single needs input and output of one dtype")
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % P or output.numel() != input.numel():
                raise ArgumentError(f"hbmcoll: all_to_all_single without split sizes needs equal "
                                 f"input and output sizes divisible by {P}")
            src = _flat_mv(input)
            out, finish = _out_buf(output)
            return self._go(opts, "alltoall", (src, out), finish, [output])
        src = _flat_mv(input).reshape(-1)
        in_row = src.numel() // input.shape[0] if input.dim() and input.shape[0] else 0
        out_row = _unit_count(output) // output.shape[0] if output.dim() and output.shape[0] else 0
        ins = list(input_split_sizes) or [input.shape[0] // P] * P
        outs = list(output_split_sizes) or [output.shape[0] // P] * P
        if len(ins) != P or len(outs) != P or sum(ins) != (input.shape[0] if input.dim() else 0) \
                or sum(outs) != (output.shape[0] if output.dim() else 0):
            raise ArgumentError("hbmcoll: all_to_all_single split sizes do not match the tensors")
        send, off = [], 0
        for s in ins:
            send.append(src[off:off + s * in_row])
            off += s * in_row
        counts = [s * out_row for s in outs]
        starts = [sum(counts[:j]) for j in range(P)]
        dst, finish0 = _out_buf(output)
        dst = dst.reshape(-1)

        def store(j, chunk):
            dst[starts[j]:starts[j] + counts[j]].copy_(chunk)
        return self._alltoallv(opts, send, counts, store, [output], finish0)

    alltoall_base = all_to_all_single

    def _alltoallv(self, opts, send, recv_counts, store, result, then=None):
        """All-to-all of blocks of different sizes: pad every block to the largest of the job."""
        P = self._size
        dtype = send[0].dtype
        local = max([s.numel() for s in send] + recv_counts + [0])
        m = torch.tensor([local], dtype=torch.int64)
        self.comm.allreduce(m, "max")
        B = int(m.item())
        sbuf = torch.zeros(P * B, dtype=dtype)
        for j, s in enumerate(send):
            sbuf[j * B:j * B + s.numel()].copy_(s)
        rbuf = torch.empty(P * B, dtype=dtype)

        def finish():
            for j in range(P):
                store(j, rbuf[j * B:j * B + recv_counts[j]])
            if then is not None:
                then()
        return self._go(opts, "alltoall", (sbuf, rbuf), finish, result)

    def barrier(self, opts=None):
        if self._inline or (opts is not None and not opts.asyncOp):
            self.comm.barrier()
            return Done([])
        return self._start(self.comm.ibarrier(), None, [])

    # point-to-point (the communicator's send/recv, p2p.py): always in the background, as
    # torch's isend/irecv; dist.send/recv wait on the Work
    def send(self, tensors, dst, tag=0):
        return self._start(self.comm.isend(self._one(tensors, "send"), dst, tag), None, tensors)

    def recv(self, tensors, src, tag=0):
        req = self.comm.irecv(self._one(tensors, "recv"), src, tag)
        return _RecvWork(req, None, tensors, self)

    def recv_anysource(self, tensors, tag=0):
        req = self.comm.irecv(self._one(tensors, "recv"), _p2p.ANY_SOURCE, tag)
        return _RecvWork(req, None, tensors, self)

    def _check_list(self, lst, like, what):
        if len(lst) != self._size:
            raise ArgumentError(f"hbmcoll: {what} must hold {self._size} tensors, got {len(lst)}")
        for x in lst:
            if x.numel() != like.numel() or x.dtype != like.dtype:
                raise ArgumentError(f"hbmcoll: every tensor of {what} must have the input's "
                                 f"size and dtype ({like.numel()} x {like.dtype})")

    # -- lifetime
    def shutdown(self):
        c, self._completer = self._completer, None
        if c is not None:
            c.stop()
        if not self.comm.closed:
            self.comm.close()

    def abort(self):
        try:
            self.comm.abort()
        finally:
            c, self._completer = self._completer, None
            if c is not None:
                c.put(None)
