"""hbmcoll for PyTorch (CPU tensors).

Importing this module registers the torch.distributed backend ``"hbmcoll"``:

    import hbmcoll.torch
    import torch.distributed as dist
    dist.init_process_group("hbmcoll")          # under hbmcoll-run, torchrun or mp.spawn
    model = torch.nn.parallel.DistributedDataParallel(model)

It also gives Horovod's functions, so a Horovod script switches by changing its import
(``import hbmcoll.torch as hvd``) and needs no torch.distributed at all:

    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ... loss.backward(); opt.step()

DistributedOptimizer allreduces the gradients while the backward pass is still running: a hook
on each parameter (``register_post_accumulate_grad_hook``) copies its gradient into a fused
bucket as soon as it is final, each full bucket is started with the nonblocking ``iallreduce``
(hbmcoll's progress thread runs it while autograd goes on), always in bucket order so every rank
starts the same collectives in the same order; ``step()`` waits for them, copies the averaged
gradients back and then runs the wrapped optimizer. (When the rank may run on one CPU only, the
bucket's allreduce runs right in the hook instead: see HBMCOLL_TORCH_INLINE in _torch_backend.)
"""
import contextlib
import io
import pickle

import numpy as _np
import torch
import torch.distributed as dist

from . import _horovod_job
from ._horovod_job import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (Horovod's names)
from . import job as _job_mod
from .compression import Compression, compressor  # noqa: F401 (Horovod's name)
from .errors import NotSupportedError
from .sharing import ParameterSharing  # noqa: F401 (memory servers: async and hybrid sharing)
from ._torch_backend import (BACKEND, ProcessGroupHbmcoll, Work, _inline_policy,  # noqa: F401
                             _RedPlan, communicator, register)

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
           "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "allgather",
           "broadcast", "broadcast_", "broadcast_async_", "synchronize", "poll",
           "broadcast_object", "allgather_object", "broadcast_parameters",
           "broadcast_optimizer_state", "DistributedOptimizer", "barrier", "join",
           "Average", "Sum", "Min", "Max", "Product", "Adasum", "Compression",
           "BACKEND", "ProcessGroupHbmcoll", "Work", "communicator", "register"]

_REDOP = {"avg": dist.ReduceOp.AVG, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
          "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}


def _dist_comm():
    """The communicator of torch.distributed's default group if that is an hbmcoll one."""
    if dist.is_available() and dist.is_initialized():
        pg = dist.distributed_c10d._get_default_group()
        if isinstance(pg, ProcessGroupHbmcoll):
            return pg.comm
    return None


# ---- the job -------------------------------------------------------------------------------------

# init() takes torch.distributed's communicator when there is one (and shutdown() leaves it
# open), else makes its own from the launcher's environment
def _default_comm():
    c = _dist_comm()
    return _job_mod.init() if c is None else c


_job = _horovod_job.Job("hbmcoll.torch", _default_comm, owned=lambda comm: comm is not _dist_comm())
init, shutdown, is_initialized = _job.init, _job.shutdown, _job.is_initialized
rank, size, local_rank, local_size = _job.rank, _job.size, _job.local_rank, _job.local_size
cross_rank, cross_size = _job.cross_rank, _job.cross_size
barrier, join, _c = _job.barrier, _job.join, _job.get


# ---- tensor collectives --------------------------------------------------------------------------

_op_of = _horovod_job.op_of


def _check_cpu(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} takes a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"hbmcoll: {what} needs a CPU tensor, got one on {t.device}")


class _Handle:
    """What the *_async functions return: synchronize(handle) gives the result."""

    __slots__ = ("req", "finish", "result")

    def __init__(self, req, finish, result):
        self.req, self.finish, self.result = req, finish, result


def _start_allreduce(t, op, prescale, postscale):
    plan = _RedPlan(t.dtype, _REDOP[op])
    buf = plan.to_work(t)
    if prescale != 1.0:
        if buf.data_ptr() == t.data_ptr():
            buf = buf * prescale  # never scale the caller's tensor before it is the result
        else:
            buf.mul_(prescale)
    req = _c().iallreduce(buf, plan.op)

    def finish():
        if postscale != 1.0:
            buf.mul_(postscale)
        plan.store(t, buf)
    return _Handle(req, finish, t)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0):
    """Start an in-place allreduce of tensor; synchronize(handle) returns it reduced."""
    _check_cpu(tensor, "allreduce")
    return _start_allreduce(tensor.detach(), _op_of(average, op), prescale_factor,
                            postscale_factor)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0):
    """Start an allreduce into a new tensor; synchronize(handle) returns it."""
    _check_cpu(tensor, "allreduce")
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return _start_allreduce(out, _op_of(average, op), prescale_factor, postscale_factor)


def synchronize(handle):
    """Wait for an *_async handle; returns its result tensor."""
    handle.req.wait()
    if handle.finish is not None:
        handle.finish()
        handle.finish = None
    return handle.result


def poll(handle):
    """True when the operation of handle has finished (synchronize() then does not block)."""
    return handle.req.test()


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0):
    """Allreduce in place (default op Average); returns tensor."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, prescale, postscale):
        ctx.op, ctx.scale = op, prescale * postscale
        return synchronize(allreduce_async(tensor, op=op, prescale_factor=prescale,
                                           postscale_factor=postscale))

    @staticmethod
    def backward(ctx, grad):
        if ctx.op not in (Average, Sum):
            raise RuntimeError(f"hbmcoll: allreduce with op {ctx.op!r} has no gradient")
        # every rank's output depends on every rank's input: the gradient of an allreduce is
        # the allreduce (same op) of the gradients
        g = synchronize(allreduce_async(grad, op=ctx.op))
        if ctx.scale != 1.0:
            g.mul_(ctx.scale)
        return g, None, None, None


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0):
    """A new tensor: tensor reduced over all ranks (default op Average). Differentiable for
    Average and Sum (the gradient is the allreduce of the output's gradients)."""
    _check_cpu(tensor, "allreduce")
    op, comp = _op_of(average, op), compressor(compression)
    sent, ctx = comp.compress(tensor)  # differentiable casts, where it casts
    if sent.requires_grad and torch.is_grad_enabled():
        return comp.decompress(_AllreduceFn.apply(sent, op, prescale_factor, postscale_factor), ctx)
    return comp.decompress(synchronize(allreduce_async(sent, op=op, prescale_factor=prescale_factor,
                                                       postscale_factor=postscale_factor)), ctx)


def _allgather(t):
    """Concatenate every rank's t along dim 0 (first dimensions may differ)."""
    t = t.detach()
    c = _c()
    if t.dim() == 0:
        t = t.reshape(1)
    n0 = torch.tensor([t.shape[0]], dtype=torch.int64)
    firsts = c.allgather(n0).reshape(-1).tolist()
    src = t.contiguous()
    if src.dtype not in _NATIVE_SET:
        src = src.reshape(-1).view(torch.uint8).reshape(src.shape[0], -1)
    m = max(firsts)
    if m != src.shape[0]:
        pad = torch.zeros((m,) + tuple(src.shape[1:]), dtype=src.dtype)
        pad[:src.shape[0]] = src
        src = pad
    out = c.allgather(src)  # (size, m, ...)
    parts = [out[i, :firsts[i]] for i in range(c.size)]
    res = torch.cat(parts) if len(set(firsts)) > 1 else out.reshape((-1,) + tuple(src.shape[1:]))
    if res.dtype != t.dtype:
        res = res.reshape(-1).view(t.dtype).reshape((-1,) + tuple(t.shape[1:]))
    return res, firsts


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        out, firsts = _allgather(tensor)
        ctx.firsts = firsts
        return out

    @staticmethod
    def backward(ctx, grad):
        g = synchronize(allreduce_async(grad, op=Sum))
        r = rank()
        start = sum(ctx.firsts[:r])
        return g[start:start + ctx.firsts[r]]


def allgather(tensor, name=None):
    """A new tensor: every rank's tensor concatenated along dim 0 in rank order (their first
    dimensions may differ). Differentiable."""
    _check_cpu(tensor, "allgather")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherFn.apply(tensor)
    return _allgather(tensor)[0]


_NATIVE_SET = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16,
                         torch.int8, torch.uint8, torch.int32, torch.int64})


def broadcast_async_(tensor, root_rank, name=None):
    _check_cpu(tensor, "broadcast")
    t = tensor.detach()
    buf = t if t.is_contiguous() else t.contiguous()
    mv = buf if buf.dtype in _NATIVE_SET else buf.reshape(-1).view(torch.uint8)
    req = _c().ibcast(mv, root=root_rank)
    finish = None if buf.data_ptr() == t.data_ptr() and t.is_contiguous() else \
        (lambda: t.copy_(buf))
    return _Handle(req, finish, tensor)


def broadcast_(tensor, root_rank, name=None):
    """Broadcast root_rank's tensor into tensor on every rank, in place; returns tensor."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank):
        ctx.root = root_rank
        return broadcast_(tensor.detach().clone(), root_rank)

    @staticmethod
    def backward(ctx, grad):
        g = synchronize(allreduce_async(grad, op=Sum))
        return (g if rank() == ctx.root else torch.zeros_like(g)), None


def broadcast(tensor, root_rank, name=None):
    """A new tensor with root_rank's values. Differentiable (the root gets the sum of every
    rank's gradient, the others zero)."""
    _check_cpu(tensor, "broadcast")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastFn.apply(tensor, root_rank)
    return broadcast_(tensor.detach().clone(), root_rank)


# ---- objects, parameters, optimizer state ----------------------------------------------------------

def broadcast_object(obj, root_rank=0, name=None):
    """root_rank's obj (pickled) on every rank."""
    c = _c()
    if c.rank == root_rank:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        n = _np.array([len(data)], _np.int64)
    else:
        data, n = None, _np.zeros(1, _np.int64)
    c.bcast(n, root=root_rank)
    buf = _np.frombuffer(bytearray(data), _np.uint8) if data is not None \
        else _np.empty(int(n[0]), _np.uint8)
    if buf.size:
        c.bcast(buf, root=root_rank)
    return obj if c.rank == root_rank else pickle.loads(buf.tobytes())


def allgather_object(obj, name=None):
    """The list of every rank's obj, in rank order."""
    c = _c()
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    lens = c.allgather(_np.array([len(data)], _np.int64)).reshape(-1)
    m = int(lens.max())
    buf = _np.zeros(m, _np.uint8)
    buf[:len(data)] = _np.frombuffer(data, _np.uint8)
    out = c.allgather(buf)
    return [pickle.loads(out[i, :int(lens[i])].tobytes()) for i in range(c.size)]


def _named(params):
    if isinstance(params, dict):
        return sorted(params.items())
    items = list(params)
    if items and isinstance(items[0], tuple):
        return items
    return list(enumerate(items))


def broadcast_parameters(params, root_rank=0):
    """Make every rank's tensors equal to root_rank's, in place: params is a state_dict(),
    named_parameters() or a list of tensors (the same on every rank)."""
    handles = [broadcast_async_(t, root_rank) for _, t in _named(params)
               if isinstance(t, torch.Tensor)]
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Give every rank root_rank's optimizer state and hyperparameters (state_dict), so
    optimizers with state (momentum, Adam moments) start equal."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    c = _c()
    if c.rank == root_rank:
        bio = io.BytesIO()
        torch.save(optimizer.state_dict(), bio)
        state = bio.getvalue()
    else:
        state = None
    state = broadcast_object(state, root_rank)
    if c.rank != root_rank:
        optimizer.load_state_dict(torch.load(io.BytesIO(state), weights_only=False))


# ---- DistributedOptimizer ------------------------------------------------------------------------

class _Bucket:
    __slots__ = ("params", "offsets", "flat", "ready", "req", "done_params")

    def __init__(self, params, dtype):
        self.params = params
        self.offsets = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.flat = torch.zeros(n, dtype=dtype)
        self.ready = 0
        self.req = None
        self.done_params = set()


class _DistributedOptimizer:
    """Mixed into a subclass of the wrapped optimizer's class (see DistributedOptimizer)."""

    def _hb_setup(self, base, named_parameters, op, backward_passes_per_step, bucket_bytes,
                  gradient_predivide_factor, compression):
        self._hb_base = base
        wire = compressor(compression).wire_dtype  # a bucket travels in its gradients' wire dtype
        self._hb_op = _op_of(None, op)
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
        self._hb_comm = init()
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
                buckets.append(_Bucket(cur, cur_dtype))
                cur, cur_bytes = [], 0
            cur.append(p)
            cur_bytes += nb
            cur_dtype = wire(p.dtype)
        if cur:
            buckets.append(_Bucket(cur, cur_dtype))
        for b in buckets:
            if b.flat.dtype not in _NATIVE_SET:
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
            if self._hb_inline:
                self._hb_comm.allreduce(b.flat, self._hb_op)
                b.req = None
            else:
                b.req = self._hb_comm.iallreduce(b.flat, self._hb_op)
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
            if self._hb_predivide != 1.0:
                b.flat.mul_(self._hb_predivide)
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
_HOROVOD_DEFAULTS = {"num_groups": (0, None), "groups": (None,), "process_set": (None,),
                     "sparse_as_dense": (False, True)}  # sparse gradients are made dense anyway


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         bucket_cap_mb=4.0, **horovod):
    """Wrap a torch optimizer so that step() applies the gradients averaged (op=Average) or
    summed (op=Sum) over all ranks. The gradients are reduced during the backward pass, in
    fused buckets of up to bucket_cap_mb; with backward_passes_per_step=k, k backward passes
    accumulate locally before one allreduce. The result is an instance of a subclass of the
    optimizer's class that shares the optimizer's parameter groups and state."""
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
                   int(bucket_cap_mb * 1024 * 1024), gradient_predivide_factor, compression)
    return dopt
