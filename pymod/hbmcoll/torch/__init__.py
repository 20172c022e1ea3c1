"""hbmcoll for PyTorch (CPU tensors).

Importing this package registers the torch.distributed backend ``"hbmcoll"``:

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

What is where:

- backend.py: the backend's registration and the creator of its groups; process_group.py: the
  group (ProcessGroupHbmcoll), with its tensor adapters (tensors.py) and Work objects (work.py);
  ddp.py: DDP's buckets in the shared arena (allreduce_hook);
- horovod_api.py: Horovod's functions; optimizer.py: DistributedOptimizer; sync_batch_norm.py:
  SyncBatchNorm; compression.py: Compression; joining.py: join() for ranks with less data (the
  framework-free parts, the job and the process sets, are in hbmcoll.horovod);
- param_sharing.py: ParameterSharing through memory servers (hbmcoll.memserver).
"""
from ..errors import ArgumentError  # noqa: F401 (importable from here before the package was split)
from ..horovod.job import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (Horovod's names)
from ..horovod.process_sets import ProcessSet, entered, taking_process_set  # noqa: F401
from .backend import communicator, register  # noqa: F401 (importing it registers the backend)
from .compression import Compression, compressor  # noqa: F401 (Horovod's name)
from .ddp import allreduce_hook  # noqa: F401 (DDP's comm hook)
from .horovod_api import (add_process_set, allgather, allgather_object, allreduce, allreduce_,  # noqa: F401
                          allreduce_async, allreduce_async_, alltoall, barrier, broadcast, broadcast_,
                          broadcast_async_, broadcast_object, broadcast_optimizer_state,
                          broadcast_parameters, cross_rank, cross_size, global_process_set,
                          grouped_allreduce, init, is_initialized, join, local_rank, local_size, poll,
                          rank, reducescatter, remove_process_set, shutdown, size, synchronize)
from .joining import ALLREDUCE, BARRIER, BCAST, OTHER, Joiner  # noqa: F401
from .optimizer import DistributedOptimizer  # noqa: F401 (Horovod's name)
from .param_sharing import ParameterSharing  # noqa: F401 (memory servers: async and hybrid sharing)
from .process_group import BACKEND, ProcessGroupHbmcoll  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401 (Horovod's name)
from .work import Work  # noqa: F401

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
           "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "allgather",
           "grouped_allreduce", "alltoall", "reducescatter", "ProcessSet", "global_process_set",
           "add_process_set", "remove_process_set", "SyncBatchNorm",
           "broadcast", "broadcast_", "broadcast_async_", "synchronize", "poll",
           "broadcast_object", "allgather_object", "broadcast_parameters",
           "broadcast_optimizer_state", "DistributedOptimizer", "barrier", "join",
           "Average", "Sum", "Min", "Max", "Product", "Adasum", "Compression",
           "BACKEND", "ProcessGroupHbmcoll", "Work", "communicator", "register", "allreduce_hook"]
