"""Horovod's DistributedOptimizer for hbmcoll.torch: the gradients are allreduced in fused
buckets while the backward pass is still running.

A hook on each parameter (``register_post_accumulate_grad_hook``) copies its gradient into a
fused bucket as soon as it is final; each full bucket is started with the nonblocking
``iallreduce`` (hbmcoll's progress thread runs it while autograd goes on), always in bucket
order so every rank starts the same collectives in the same order; ``step()`` waits for them,
copies the averaged gradients back and then runs the wrapped optimizer. (When the rank may run
on one CPU only, the bucket's allreduce runs right in the hook instead: see
HBMCOLL_TORCH_INLINE in process_group.py.) Each bucket's allreduce is announced to ranks that have
joined (joining.py), which take part with zeros. On one node the buckets live in the
communicator's shared arena, so their allreduce runs at hbmcoll.empty's speed, without the copy
in and out of the staging cells (bench/optimizer_buckets.py measures it).
"""
import contextlib

import torch

from ..errors import NotSupportedError
from ..horovod.job import Average, Sum, op_of
from ..horovod.process_sets import GlobalProcessSet
from . import horovod_api as hvd
from .compression import compressor
from .process_group import _inline_policy
from .tensors import _NATIVE


ARENA_BUCKETS = True  # bench/optimizer_buckets.py turns it off for its A/B


def _in_arena(comm, n, dtype):
    """n zeros of dtype in comm's shared arena, where the collectives skip the staging copy (as
    for hbmcoll.empty); None across nodes, or when the arena is full (then private memory)."""
    core = getattr(comm, "_c", None)  # one node's communicator
    if core is None or n == 0 or not ARENA_BUCKETS:
        return None, None
    try:
        raw = core.arena_alloc(n * torch.empty(0, dtype=dtype).element_size())
    except (MemoryError, OSError, RuntimeError):
        return None, None
    return torch.frombuffer(raw, dtype=dtype, count=n).zero_(), raw


class _Bucket:
    __slots__ = ("params", "offsets", "flat", "ready", "req", "done_params", "header", "arena")

    def __init__(self, params, dtype, comm=None):
        self.params = params
        self.offsets = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.flat, self.arena = _in_arena(comm, n, dtype)  # arena: keeps the shared memory alive
        if self.flat is None:
            self.flat = torch.zeros(n, dtype=dtype)
        self.ready = 0
        self.req = None
        self.done_params = set()
        self.header = None  # the join header sent with its allreduce (joining.py)


class _DistributedOptimizer:
    """Mixed into a subclass of the wrapped optimizer's class (see DistributedOptimizer)."""

    def _hb_setup(self, base, named_parameters, op, backward_passes_per_step, bucket_bytes,
                  gradient_predivide_factor, compression, process_set):
        self._hb_base = base
        wire = compressor(compression).wire_dtype  # a bucket travels in its gradients' wire dtype
        self._hb_op = op_of(None, op)
        if self._hb_op not in (Average, Sum):
            raise ValueError("DistributedOptimizer reduces gradients with Average or Sum")
        self._hb_passes = int(backward_passes_per_step)
        self._hb_predivide = float(gradient_predivide_factor)
        if self._hb_predivide != 1.0 and self._hb_op != Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter appears twice in the optimizer's param_groups")
        if named_parameters is not None:
            named = list(named_parameters)
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise ValueError("named_parameters has duplicate names")
            known = {id(p) for _, p in named}
            missing = [i for i, p in enumerate(params) if id(p) not in known]
            if missing:
                raise ValueError(f"named_parameters lacks {len(missing)} of the optimizer's "
                                 "parameters")
        hvd.init()
        self._hb_comm = hvd._c() if process_set is None else process_set._comm()
        self._hb_joiner = hvd._joiner
        self._hb_inline = _inline_policy()
        for p in params:
            if p.device.type != "cpu":
                raise ValueError(f"hbmcoll: DistributedOptimizer needs CPU parameters, got {p.device}")
            if p.is_sparse:
                raise ValueError("hbmcoll: sparse parameters are not supported")
        # gradients become final roughly in reverse order of the parameters: fill buckets so
        # that the first bucket is the first to be complete
        buckets, cur, cur_bytes, cur_dtype = [], [], 0, None
        for p in reversed(params):
            nb = p.numel() * p.element_size()
            if cur and (wire(p.dtype) != cur_dtype or cur_bytes + nb > bucket_bytes):
                buckets.append(_Bucket(cur, cur_dtype, self._hb_comm))
                cur, cur_bytes = [], 0
            cur.append(p)
            cur_bytes += nb
            cur_dtype = wire(p.dtype)
        if cur:
            buckets.append(_Bucket(cur, cur_dtype, self._hb_comm))
        for b in buckets:
            if b.flat.dtype not in _NATIVE:
                raise TypeError(f"hbmcoll: gradients of dtype {b.flat.dtype} are not supported")
        self._hb_buckets = buckets
        self._hb_where = {}
        for bi, b in enumerate(buckets):
            for p, off in zip(b.params, b.offsets):
                self._hb_where[p] = (bi, off)
        self._hb_count = {p: 0 for p in params}
        self._hb_next = 0            # next bucket to start (buckets start in index order)
        self._hb_dirty = False       # a gradient went into a bucket since the last synchronize
        self._hb_skip = False
        self._hb_hooks = [p.register_post_accumulate_grad_hook(self._hb_hook) for p in params]

    # called by autograd when p.grad is final for this backward pass
    def _hb_hook(self, p):
        c = self._hb_count[p] + 1
        if c < self._hb_passes:
            self._hb_count[p] = c
            return
        self._hb_count[p] = 0
        bi, off = self._hb_where[p]
        b = self._hb_buckets[bi]
        if p in b.done_params:
            raise RuntimeError(
                "hbmcoll DistributedOptimizer: a gradient was computed more than "
                "backward_passes_per_step times before step(); call step() (or synchronize()) "
                "after each backward, or raise backward_passes_per_step")
        self._hb_fill(b, p, off)
        self._hb_dirty = True
        if b.ready == len(b.params):
            self._hb_launch_ready()

    def _hb_fill(self, b, p, off):
        n = p.numel()
        g = p.grad
        dst = b.flat[off:off + n]
        if g is None:
            dst.zero_()
        else:
            if g.is_sparse:
                g = g.to_dense()
            dst.copy_(g.reshape(-1))
        b.done_params.add(p)
        b.ready += 1

    def _hb_launch_ready(self):
        bs = self._hb_buckets
        while self._hb_next < len(bs) and bs[self._hb_next].ready == len(bs[self._hb_next].params):
            b = bs[self._hb_next]
            if self._hb_predivide != 1.0:
                b.flat.mul_(1.0 / self._hb_predivide)
            # a sum, divided in synchronize() by the ranks that took part (joined ones add zeros);
            # the header goes ahead without a wait, so this bucket never waits behind those in flight
            b.header = self._hb_joiner.start_header(self._hb_comm, b.flat, "sum")
            if self._hb_inline:
                self._hb_comm.allreduce(b.flat, "sum")
                b.req = None
            else:
                b.req = self._hb_comm.iallreduce(b.flat, "sum")
            self._hb_next += 1

    def synchronize(self):
        """Finish the gradients' allreduce now (start what has not started: parameters
        whose gradient did not come this step contribute their .grad, or zeros) and write the
        reduced gradients into .grad."""
        for b in self._hb_buckets:
            if b.ready < len(b.params):
                for p, off in zip(b.params, b.offsets):
                    if p not in b.done_params:
                        self._hb_fill(b, p, off)
        self._hb_launch_ready()
        for b in self._hb_buckets:
            if b.req is not None:
                b.req.wait()
                b.req = None
            active = self._hb_joiner.finish_header(self._hb_comm, b.header)
            divide = active if self._hb_op == Average else 1
            if self._hb_predivide != 1.0 or divide != 1:
                b.flat.mul_(self._hb_predivide / divide)
            for p, off in zip(b.params, b.offsets):
                src = b.flat[off:off + p.numel()].view(p.shape)
                if p.grad is None:
                    p.grad = src.to(p.dtype, copy=True)
                else:
                    p.grad.copy_(src)  # back in the gradient's own dtype
            b.ready = 0
            b.done_params.clear()
        self._hb_next = 0
        self._hb_dirty = False
        for p in self._hb_count:
            self._hb_count[p] = 0

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For step() right after an explicit synchronize() (e.g. to clip gradients)."""
        self._hb_skip = True
        try:
            yield
        finally:
            self._hb_skip = False

    def step(self, closure=None):
        if self._hb_dirty and not self._hb_skip:
            self.synchronize()
        return self._hb_base.step(self, closure)

    def remove_hooks(self):
        for h in self._hb_hooks:
            h.remove()
        self._hb_hooks = []


# Horovod's arguments this one has no use for: accepted at the values that ask for nothing
_HOROVOD_DEFAULTS = {"num_groups": (0, None), "groups": (None,), "sparse_as_dense": (False, True)}  # sparse gradients are made dense anyway


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         bucket_cap_mb=4.0, process_set=None, **horovod):
    """Wrap a torch optimizer so that step() applies the gradients averaged (op=Average) or
    summed (op=Sum) over all ranks. The gradients are reduced during the backward pass, in
    fused buckets of up to bucket_cap_mb; with backward_passes_per_step=k, k backward passes
    accumulate locally before one allreduce; with process_set= (a ProcessSet), over its ranks.
    The result is an instance of a subclass of the optimizer's class that shares the
    optimizer's parameter groups and state."""
    if isinstance(process_set, GlobalProcessSet):
        process_set = None
    for name, value in horovod.items():
        if name not in _HOROVOD_DEFAULTS:
            raise TypeError(f"DistributedOptimizer() got an unexpected keyword argument {name!r}")
        if not any(value is v or (v is not None and value == v) for v in _HOROVOD_DEFAULTS[name]):
            raise NotSupportedError(f"DistributedOptimizer({name}={value!r}): not supported; every rank's "
                                    "gradients are reduced in fused buckets of bucket_cap_mb")
    base = optimizer.__class__
    cls = type(base.__name__, (_DistributedOptimizer, base), {})
    cls.step = _DistributedOptimizer.step
    dopt = cls.__new__(cls)
    dopt.__dict__.update(optimizer.__dict__)
    dopt._hb_setup(base, named_parameters, op, backward_passes_per_step,
                   int(bucket_cap_mb * 1024 * 1024), gradient_predivide_factor, compression, process_set)
    return dopt
