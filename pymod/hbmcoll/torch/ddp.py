"""DDP's gradient buckets in the communicator's shared arena, so DDP's allreduce runs at
hbmcoll.empty's speed (no copy through the staging cells) without the user changing code.

DDP's reducer allocates its buckets itself (``at::empty``) and gives no way to place them. A
comm hook is handed each bucket, though, and ``UntypedStorage._swap_data_ptr_`` swaps the memory
under a storage in place: the hook copies the bucket into an arena block once and swaps, and
every tensor sharing that storage follows (the bucket, the reducer's views of it, and the
parameters' ``.grad`` under ``gradient_as_bucket_view``). The arena block lives as long as the
bucket's storage (its deleter drops the block); when DDP rebuilds its buckets after the first
step, the new ones are moved on their first allreduce. Nothing outside torch holds a bucket's
address, which is what makes the swap safe there and unsafe for tensors in general (a NumPy
view of a user's tensor would keep the old address).

``hbmcoll.torch.allreduce_hook`` is the hook (averages, as torch's ``allreduce_hook``). A DDP
model over an hbmcoll group on one node gets it at its first forward, unless a hook is
registered already; ``HBMCOLL_TORCH_DDP_ARENA=0`` turns that off, and its buckets stay in
private memory (staged), as with any other backend. A bucket the arena has no room for stays in
private memory too, with one line saying so.

Where hbmcoll registers the hook itself, its state (_HookState) keeps each moved bucket's
allreduce prepared (Comm.prepare): DDP calls the hook right after the backward pass, when each
call into torch costs microseconds, and a prepared bucket needs none (bench/README.md).
"""
import functools
import logging
import weakref

import torch
import torch.distributed as dist

from .. import log
from .._core import ALLREDUCE as _ALLREDUCE, AVG as _AVG
from ..errors import ArgumentError
from .process_group import ProcessGroupHbmcoll, env_switch
from .tensors import _NATIVE

_SWAP = hasattr(torch.UntypedStorage, "_swap_data_ptr_")  # torch >= 2.4
_in_arena = {}  # data_ptr of a storage moved into an arena -> id of that arena's communicator
_said = set()      # the one-line notices given, once per process
_auto_handle = None


def _say_once(key, rank, text):
    if key not in _said:
        _said.add(key)
        log.say(logging.WARNING, rank, text)


def _core_of(pg):
    """The one-node core communicator behind an hbmcoll process group, else None."""
    if not isinstance(pg, ProcessGroupHbmcoll):
        return None
    return getattr(pg.comm, "_c", None)


def move_to_arena(t, core, rank=0):
    """Move the storage of tensor t into core's shared arena in place (contents kept); every
    tensor sharing the storage follows. True if it lives there now."""
    if _in_arena.get(t.data_ptr()) == id(core):  # a bucket is a whole storage: its address
        return True
    st = t.untyped_storage()
    ptr, n = st.data_ptr(), st.nbytes()
    if _in_arena.get(ptr) == id(core):
        return True
    if not _SWAP or n == 0:
        return False
    try:
        raw = core.arena_alloc(n)
    except MemoryError:
        _say_once("full", rank, f"a DDP bucket of {n} bytes stays in private memory (staged): the "
                                "shared arena is full; HBMCOLL_ARENA_BYTES sets its size per rank")
        return False
    block = torch.frombuffer(raw, dtype=torch.uint8, count=n).untyped_storage()  # owns raw
    block.copy_(st)
    st._swap_data_ptr_(block)  # st now owns the arena block; block the old memory (freed with it)
    _in_arena[st.data_ptr()] = id(core)  # while core lives, no malloc returns this address
    return True


class _HookState:
    """What DDP hands allreduce_hook where hbmcoll registered it (_at_forward): the group, and
    the allreduce of each bucket seen twice in the arena, prepared (Comm.prepare), by the id of
    the bucket's tensor: calls = {id: (prepared call, completed future, bucket index)}; seen =
    {bucket index: weakref to the tensor seen there once}. Twice, because the zeros DDP hands a
    joined rank (Join) are new tensors every step: they are never prepared, nor held here."""
    __slots__ = ("process_group", "calls", "seen")

    def __init__(self, process_group):
        self.process_group = process_group
        self.calls = {}
        self.seen = {}

    def forget_from(self, index):
        """A bucket not prepared at index: DDP rebuilt its buckets, or hands a joined rank
        zeros. It calls them in index order (its reducer's next_bucket_), so the entries from
        index on are gone or about to be: drop them, and with them their tensors and arena
        blocks, before the new bucket asks the arena for its own."""
        for key in [k for k, v in self.calls.items() if v[2] >= index]:
            del self.calls[key]

    def seen_twice(self, index, buf):
        """True the second time buf comes at index (then prepare it), else remember it."""
        first = self.seen.get(index)
        if first is not None and first() is buf:
            del self.seen[index]
            return True
        self.seen[index] = weakref.ref(buf)
        return False


def allreduce_hook(state, bucket):
    """DDP comm hook: average the bucket over the group in place, its storage moved into
    hbmcoll's shared arena first where the group is an hbmcoll one on one node.
    ``ddp_model.register_comm_hook(None, hbmcoll.torch.allreduce_hook)`` (state: a process group,
    or None for the default one); hbmcoll registers it by itself at the first forward."""
    # DDP calls this once per bucket with caches cold from the backward pass, where every call
    # into torch costs microseconds: a prepared bucket is one dict lookup and one C call
    buf = bucket.buffer()
    index = None
    if state.__class__ is _HookState:
        call = state.calls.get(id(buf))  # the entry holds buf: its id is not reused meanwhile
        if call is not None:
            call[0]()
            return call[1]
        pg = state.process_group
        index = bucket.index()
        state.forget_from(index)
    else:
        pg = state if state is not None else dist.distributed_c10d._get_default_group()
    core = _core_of(pg)
    if core is None:  # another backend, or across nodes: as torch's own allreduce_hook
        buf.div_(pg.size())
        return dist.all_reduce(buf, group=pg, async_op=True).get_future().then(_first)
    moved = move_to_arena(buf, core, pg.rank())
    if buf.dtype not in _NATIVE:  # the backend adapts it (as DDP's own call would be)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.AVG
        return pg.allreduce([buf], opts).get_future().then(_first)
    if moved and pg._inline and index is not None and state.seen_twice(index, buf):
        # in the arena for good (nothing swaps its storage again): its address is fixed
        run = core.prepare(_ALLREDUCE, buf, buf, _AVG, 0)
        run()
        fut = _done(buf)
        state.calls[id(buf)] = (run, fut, index)
        return fut
    work = pg._allreduce_native(buf, "avg", [buf])
    if work is not None:
        return work.get_future().then(_first)
    return _done(buf)


def _done(value):
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def _first(fut):
    return fut.value()[0]


def _at_forward(module, args):
    """Global forward pre-hook: give a DDP model over an hbmcoll group allreduce_hook, once."""
    if module.__dict__.get("_hbmcoll_seen") or not isinstance(
            module, torch.nn.parallel.DistributedDataParallel):
        return None
    module._hbmcoll_seen = True
    if _core_of(module.process_group) is None or module._comm_hooks:
        return None
    try:
        module.register_comm_hook(_HookState(module.process_group), allreduce_hook)
    except RuntimeError:  # a built-in hook is registered (DDP allows one)
        return None
    # DDP takes one hook: a user's, registered after this, gets this error instead of torch's
    late = functools.partial(_late_hook, module)
    module.register_comm_hook = module._register_builtin_comm_hook = late
    if not _SWAP:
        _say_once("swap", module.process_group.rank(), "this torch cannot move DDP's buckets into "
                  "the shared arena (no UntypedStorage._swap_data_ptr_): they stay in private memory")
    return None


def _late_hook(module, *args, **kwargs):
    raise ArgumentError("hbmcoll gave this DDP model its comm hook (allreduce_hook, which keeps the "
                        "buckets in the shared arena) at its first forward, and DDP takes one: "
                        "register yours before the first forward, or set HBMCOLL_TORCH_DDP_ARENA=0")


def install():
    """Watch for DDP models over hbmcoll groups (called when the first hbmcoll group is made)."""
    global _auto_handle
    if _auto_handle is None and env_switch("HBMCOLL_TORCH_DDP_ARENA") is not False:
        _auto_handle = torch.nn.modules.module.register_module_forward_pre_hook(_at_forward)
