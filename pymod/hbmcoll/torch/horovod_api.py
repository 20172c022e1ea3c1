"""Horovod's functions for torch tensors (hbmcoll.torch exports them): the job (init, rank, size,
...), allreduce and its async and grouped forms, allgather, alltoall, reducescatter, broadcast,
the object and parameter broadcasts, barrier and join, each over the job's communicator or the
call's process set.

A Horovod script switches by changing its import (``import hbmcoll.torch as hvd``) and needs no
torch.distributed at all:

    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ... loss.backward(); opt.step()

DistributedOptimizer (optimizer.py) and SyncBatchNorm (sync_batch_norm.py) are built on these
functions. join() lets ranks with less data finish first (joining.py): every hvd collective is
announced to the ranks that have joined, which take part with neutral data.
"""
import io

import numpy as _np
import torch
import torch.distributed as dist

from ..errors import ArgumentError
from ..horovod import job as _horovod_job
from ..horovod import process_sets as _ps
from ..horovod.job import Average, Sum
from ..horovod.process_sets import ProcessSet, entered, taking_process_set
from ..launch import job as _job_mod
from .compression import compressor
from .joining import ALLREDUCE, BARRIER, BCAST, OTHER, Joiner
from .process_group import ProcessGroupHbmcoll
from .tensors import _NATIVE, _RedPlan

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
shutdown, is_initialized = _job.shutdown, _job.is_initialized
rank, size, local_rank, local_size = _job.rank, _job.size, _job.local_rank, _job.local_size
cross_rank, cross_size = _job.cross_rank, _job.cross_size
_joiner = Joiner()
global_process_set = _ps.GlobalProcessSet()


def init(comm=None, process_sets=None):
    """Join the job (idempotent): the given hbmcoll communicator, torch.distributed's hbmcoll
    group, else one made from the launcher's environment; then add process_sets (ProcessSet
    objects or lists of ranks), on every rank alike."""
    c = _job.init(comm)
    for ps in process_sets or ():
        add_process_set(ps)
    return c


def add_process_set(process_set):
    """Make a ProcessSet (or a list of ranks) usable as process_set=; every rank calls it alike."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    return _ps.add(_job.get(), ps)


def remove_process_set(process_set):
    """The set's communicator closes; process_set= no longer takes it."""
    _ps.remove(process_set)


def _c():
    """The communicator of the current call: its process set's, else the job's."""
    ps = _ps.current.get()
    return ps.comm if ps is not None else _job.get()


def _root(root_rank):
    """A root given as a rank of the job (Horovod's), as a rank of the current call's set."""
    ps = _ps.current.get()
    if ps is None:
        return root_rank
    if root_rank not in ps.ranks:
        raise ArgumentError(f"root_rank {root_rank} is not in {ps!r}")
    return ps.ranks.index(root_rank)


def barrier():
    """Every rank waits for all (ranks that have joined take part)."""
    c = _c()
    _joiner.header(c, BARRIER)
    c.barrier()


def join(device=-1):
    """This rank has no more data: it takes part in the other ranks' hvd collectives with
    neutral data (zeros for sums) until every rank has called join(). Returns the rank that
    joined last, on every rank."""
    return _joiner.join(_c())


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
    c = _c()
    op = plan.op
    active = _joiner.header(c, ALLREDUCE, buf, op)
    if active < c.size and op == "avg":  # the ranks that joined have nothing to average in
        op, postscale = "sum", postscale / active
    req = c.iallreduce(buf, op)

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
        ctx.ps = _ps.current.get()  # the backward pass runs on the same process set
        ctx.op, ctx.scale = op, prescale * postscale
        return synchronize(allreduce_async(tensor, op=op, prescale_factor=prescale,
                                           postscale_factor=postscale))

    @staticmethod
    def backward(ctx, grad):
        with entered(ctx.ps):
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
    _joiner.header(c, OTHER)
    if t.dim() == 0:
        t = t.reshape(1)
    n0 = torch.tensor([t.shape[0]], dtype=torch.int64)
    firsts = c.allgather(n0).reshape(-1).tolist()
    src = t.contiguous()
    row = int(_np.prod(src.shape[1:])) * src.element_size()
    out = c.allgatherv(src.reshape(-1).view(torch.uint8), counts=[f * row for f in firsts])  # rows as bytes
    return out.view(t.dtype).reshape((sum(firsts),) + tuple(t.shape[1:])), firsts


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        ctx.ps = _ps.current.get()  # the backward pass runs on the same process set
        out, firsts = _allgather(tensor)
        ctx.firsts = firsts
        return out

    @staticmethod
    def backward(ctx, grad):
        with entered(ctx.ps):
            g = synchronize(allreduce_async(grad, op=Sum))
            r = _c().rank
            start = sum(ctx.firsts[:r])
            return g[start:start + ctx.firsts[r]]


def allgather(tensor, name=None):
    """A new tensor: every rank's tensor concatenated along dim 0 in rank order (their first
    dimensions may differ). Differentiable."""
    _check_cpu(tensor, "allgather")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherFn.apply(tensor)
    return _allgather(tensor)[0]


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0):
    """allreduce of a list of tensors as one: fused into a flat buffer per dtype, one allreduce
    each; returns new tensors in the list's order and shapes."""
    if not tensors:
        return []
    for t in tensors:
        _check_cpu(t, "grouped_allreduce")
    op, comp = _op_of(average, op), compressor(compression)
    sent = [comp.compress(t.detach()) for t in tensors]
    out = [None] * len(tensors)
    for dtype in dict.fromkeys(x.dtype for x, _ in sent):  # in the order of first appearance
        idx = [i for i, (x, _) in enumerate(sent) if x.dtype == dtype]
        flat = torch.cat([sent[i][0].reshape(-1) for i in idx])
        synchronize(allreduce_async_(flat, op=op, prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor))
        at = 0
        for i in idx:
            x, ctx = sent[i]
            out[i] = comp.decompress(flat[at:at + x.numel()].view(x.shape).clone(), ctx)
            at += x.numel()
    return out


def _rows(tensor, splits, what):
    """tensor's rows (dim 0) per rank, checked, and the elements in a row."""
    c = _c()
    n0 = tensor.shape[0] if tensor.dim() else 1
    if splits is None:
        if n0 % c.size:
            raise ArgumentError(f"{what}: {n0} rows do not split evenly over {c.size} ranks: give splits")
        splits = [n0 // c.size] * c.size
    splits = [int(v) for v in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(splits) != c.size or sum(splits) != n0 or min(splits) < 0:
        raise ArgumentError(f"{what}: splits must be {c.size} counts >= 0 adding up to the {n0} rows")
    return splits, (tensor[0].numel() if tensor.dim() else 1)


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits):
        ctx.ps = _ps.current.get()  # the backward pass runs on the same process set
        out, received = _alltoall(tensor, splits)
        ctx.received = received.tolist()
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _):
        with entered(ctx.ps):
            return _alltoall(grad.contiguous(), ctx.received)[0], None


def _alltoall(tensor, splits):
    c = _c()
    _joiner.header(c, OTHER)
    splits, row = _rows(tensor, splits, "alltoall")
    received = c.alltoall(_np.array(splits, _np.int64))
    out = c.alltoallv(tensor.detach().contiguous().reshape(-1), [k * row for k in splits])
    return out.view((int(received.sum()),) + tuple(tensor.shape[1:])), torch.from_numpy(received)


def alltoall(tensor, splits=None, name=None):
    """Rows (dim 0) of tensor, splits[j] of them to rank j (default: evenly); returns the rows
    received from every rank in rank order, and how many came from each (a tensor).
    Differentiable."""
    _check_cpu(tensor, "alltoall")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AlltoallFn.apply(tensor, splits)
    return _alltoall(tensor, splits)


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, prescale, postscale):
        ctx.ps = _ps.current.get()  # the backward pass runs on the same process set
        ctx.op, ctx.scale = op, prescale * postscale
        return _reducescatter(tensor, op, prescale, postscale)

    @staticmethod
    def backward(ctx, grad):
        if ctx.op not in (Average, Sum):
            raise RuntimeError(f"hbmcoll: reducescatter with op {ctx.op!r} has no gradient")
        with entered(ctx.ps):
            g = _allgather(grad)[0]  # every rank's input reached every rank's rows
            return g * (ctx.scale / (_c().size if ctx.op == Average else 1)), None, None, None


def _reducescatter(tensor, op, prescale, postscale):
    c = _c()
    _joiner.header(c, OTHER)
    n0 = tensor.shape[0] if tensor.dim() else 1
    splits, row = _rows(tensor, [n0 // c.size + (r < n0 % c.size) for r in range(c.size)], "reducescatter")
    flat = tensor.detach().contiguous().reshape(-1)
    if prescale != 1.0:
        flat = flat * prescale
    out = c.reduce_scatter(flat, op=op, counts=[k * row for k in splits])
    if postscale != 1.0:
        out.mul_(postscale)
    return out.view((splits[c.rank],) + tuple(tensor.shape[1:]))


def reducescatter(tensor, name=None, compression=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    """tensor reduced over the ranks (default op Average) and split along dim 0: rank r gets its
    share of the rows (the first ranks one more when they do not split evenly). Differentiable
    for Average and Sum."""
    _check_cpu(tensor, "reducescatter")
    op, comp = _op_of(None, op), compressor(compression)
    sent, ctx = comp.compress(tensor)
    if sent.requires_grad and torch.is_grad_enabled():
        return comp.decompress(_ReducescatterFn.apply(sent, op, prescale_factor, postscale_factor), ctx)
    return comp.decompress(_reducescatter(sent, op, prescale_factor, postscale_factor), ctx)


def broadcast_async_(tensor, root_rank, name=None):
    """Start broadcasting root_rank's tensor into tensor on every rank; synchronize(handle)."""
    _check_cpu(tensor, "broadcast")
    t = tensor.detach()
    buf = t if t.is_contiguous() else t.contiguous()
    mv = buf if buf.dtype in _NATIVE else buf.reshape(-1).view(torch.uint8)
    c = _c()
    root = _root(root_rank)
    _joiner.header(c, BCAST, mv.reshape(-1), root=root)
    req = c.ibcast(mv, root=root)
    finish = None if buf.data_ptr() == t.data_ptr() and t.is_contiguous() else \
        (lambda: t.copy_(buf))
    return _Handle(req, finish, tensor)


def broadcast_(tensor, root_rank, name=None):
    """Broadcast root_rank's tensor into tensor on every rank, in place; returns tensor."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank):
        ctx.ps = _ps.current.get()  # the backward pass runs on the same process set
        ctx.root = root_rank
        return broadcast_(tensor.detach().clone(), root_rank)

    @staticmethod
    def backward(ctx, grad):
        with entered(ctx.ps):
            g = synchronize(allreduce_async(grad, op=Sum))
            return (g if _c().rank == _root(ctx.root) else torch.zeros_like(g)), None


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
    _joiner.header(c, OTHER)
    return c.bcast_object(obj, root=_root(root_rank))


def allgather_object(obj, name=None):
    """The list of every rank's obj, in rank order."""
    c = _c()
    _joiner.header(c, OTHER)
    return c.allgather_object(obj)


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
    c, root = _c(), _root(root_rank)
    if c.rank == root:
        bio = io.BytesIO()
        torch.save(optimizer.state_dict(), bio)
        state = bio.getvalue()
    else:
        state = None
    state = broadcast_object(state, root_rank)
    if c.rank != root:
        optimizer.load_state_dict(torch.load(io.BytesIO(state), weights_only=False))


# process_set= on every collective of this module (Horovod's keyword): the call runs on the set
for _name in ("barrier", "allreduce_async_", "allreduce_async", "allreduce_", "allreduce", "allgather",
              "grouped_allreduce", "alltoall", "reducescatter", "broadcast_async_", "broadcast_", "broadcast",
              "broadcast_object", "allgather_object", "broadcast_parameters", "broadcast_optimizer_state"):
    globals()[_name] = taking_process_set(globals()[_name])
