"""hbmcoll for TensorFlow and Keras, with Horovod's names.

A Horovod script switches by changing its import:

    import hbmcoll.tensorflow as hvd          # was: import horovod.tensorflow(.keras) as hvd
    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)   # gradients averaged over the ranks
    ...
    hvd.broadcast_variables(model.variables, root_rank=0)

    # Keras
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(optimizer=opt, ...)
    model.fit(..., callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])

Everything works eagerly and inside tf.function: in a graph the collective is a
``tf.numpy_function`` (stateful, so TensorFlow keeps the collectives in program order on every
rank, which hbmcoll needs). The gradients of a step go in one fused allreduce per dtype.
allreduce, allgather and broadcast are differentiable (the gradient of an allreduce is the
allreduce of the gradients, as in Horovod). CPU only; XLA (jit_compile=True) cannot compile the
collectives, so Keras models must not force it (Keras's default on a CPU-only machine is off).
"""
import sys
import types

import numpy as np
import tensorflow as tf

from ..errors import ArgumentError, NotSupportedError
from ..horovod import job as _horovod_job
from ..horovod.job import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (Horovod's names)
from ..launch import job as _job_mod

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
           "allreduce", "grouped_allreduce", "allgather", "alltoall", "reducescatter", "broadcast",
           "broadcast_variables",
           "broadcast_object", "allgather_object", "barrier", "join", "DistributedGradientTape",
           "DistributedOptimizer", "callbacks", "Average", "Sum", "Min", "Max", "Product",
           "Adasum", "Compression"]


_NATIVE = {np.dtype(t) for t in ("int8", "uint8", "int32", "int64", "float16", "float32",
                                  "float64")}
_BF16 = np.dtype(tf.bfloat16.as_numpy_dtype)


# ---- the job -------------------------------------------------------------------------------------

# TensorFlow runs these ops (py_function) on its own inter-op threads, in the order the
# program's dependencies give, the same on every rank (what Horovod relies on too): any thread
# may issue the collectives.
_job = _horovod_job.Job("hbmcoll.tensorflow", _job_mod.init, any_thread=True)
init, shutdown, is_initialized = _job.init, _job.shutdown, _job.is_initialized
rank, size, local_rank, local_size = _job.rank, _job.size, _job.local_rank, _job.local_size
cross_rank, cross_size = _job.cross_rank, _job.cross_size
barrier, join, _c = _job.barrier, _job.join, _job.get


_op_of = _horovod_job.op_of


class Compression:
    """Horovod's compression= choices: none, or fp16 (floating-point tensors travel as
    float16 and come back in their own dtype)."""

    class none:
        """Tensors travel as they are."""

    class fp16:
        """Floating-point tensors travel as float16."""


def _wire(compression):
    """The dtype floating-point tensors travel in, or None; an unknown choice is refused."""
    if compression is None or compression is Compression.none:
        return None
    if compression is Compression.fp16:
        return tf.float16
    raise ArgumentError(f"compression={compression!r}: hbmcoll.tensorflow.Compression.none or .fp16")


def _unsupported(**given):
    """Horovod's arguments this module has no use for, at values that ask for something."""
    for name, value in given.items():
        if value not in ("", 0, None, False):
            raise NotSupportedError(f"{name}={value!r}: not supported by hbmcoll.tensorflow (CPU tensors, "
                                    "every rank, fused per dtype)")


# ---- NumPy level: what runs eagerly or inside tf.numpy_function ------------------------------------

def _red_dtype(dt):
    """The dtype hbmcoll reduces arrays of dtype dt in."""
    if dt in _NATIVE:
        return dt
    if dt == _BF16 or dt.kind == "f":
        return np.dtype(np.float32)
    if dt == np.bool_:
        return np.dtype(np.uint8)
    if dt.kind in "iu":
        return np.dtype(np.int64)
    raise TypeError(f"hbmcoll: cannot reduce tensors of dtype {dt}")


def _np_allreduce_many(arrays, op, prescale=1.0, postscale=1.0):
    """Reduce a list of arrays over the ranks: one fused allreduce per dtype. New arrays."""
    c = _c()
    out = [None] * len(arrays)
    by_dtype = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(np.asarray(a).dtype, []).append(i)
    for dt, idx in by_dtype.items():   # dict order: first appearance, the same on every rank
        rdt = _red_dtype(dt)
        rop = op
        if dt == np.bool_:
            rop = {Sum: Max, Average: Max, Product: Min}.get(op, op)
        flat = np.concatenate([np.asarray(arrays[i], dtype=rdt).reshape(-1) for i in idx]) \
            if len(idx) > 1 else np.array(arrays[idx[0]], dtype=rdt, copy=True).reshape(-1)
        if prescale != 1.0:
            flat *= prescale
        c.allreduce(flat, rop)
        if postscale != 1.0:
            flat *= postscale
        off = 0
        for i in idx:
            shape = np.shape(arrays[i])
            n = int(np.prod(shape, dtype=np.int64))
            out[i] = flat[off:off + n].reshape(shape).astype(dt, copy=False)
            off += n
    return out


def _contig(a):
    """a as a C-contiguous array (np.ascontiguousarray would turn 0-d into 1-d)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


def _mv(a):
    """A contiguous array hbmcoll can move, and the dtype to view the result back as."""
    a = _contig(a)
    if a.dtype in _NATIVE:
        return a, None
    return a.reshape(-1).view(np.uint8), a.dtype


def _np_bcast(a, root):
    a = np.array(a, copy=True)
    buf, back = _mv(a)
    if buf.size:
        _c().bcast(buf, root=root)
    return a


def _np_bcast_many(arrays, root):
    """Broadcast a list of arrays from root: one fused bcast of their bytes."""
    arrays = [_contig(a) for a in arrays]
    total = sum(a.nbytes for a in arrays)
    flat = np.empty(total, np.uint8)
    off = 0
    for a in arrays:
        flat[off:off + a.nbytes] = a.reshape(-1).view(np.uint8)
        off += a.nbytes
    if total:
        _c().bcast(flat, root=root)
    out, off = [], 0
    for a in arrays:
        out.append(flat[off:off + a.nbytes].view(a.dtype).reshape(a.shape).copy())
        off += a.nbytes
    return out


def _np_allgather(a):
    """Concatenate every rank's a along axis 0 (first dimensions may differ)."""
    c = _c()
    a = _contig(a)
    if a.ndim == 0:
        a = a.reshape(1)
    firsts = c.allgather(np.array([a.shape[0]], np.int64)).reshape(-1)
    row = int(np.prod(a.shape[1:], dtype=np.int64)) * a.itemsize  # rows travel as bytes, any dtype
    got = c.allgatherv(a.reshape(-1).view(np.uint8), counts=firsts * row)
    return got.view(a.dtype).reshape((int(firsts.sum()),) + a.shape[1:]), firsts


def _np_alltoall(a, splits):
    """Rows of a, splits[j] of them to rank j: the rows received (rank order) and their counts."""
    c, a = _c(), _contig(a)
    splits = [int(v) for v in np.asarray(splits).reshape(-1)]
    if len(splits) != c.size or sum(splits) != (a.shape[0] if a.ndim else 1) or min(splits) < 0:
        raise ArgumentError(f"alltoall: splits must be {c.size} counts >= 0 adding up to the rows of the tensor")
    row = a[0].nbytes if a.ndim and a.shape[0] else 0
    received = c.alltoall(np.array(splits, np.int64))
    raw = a.reshape(-1).view(np.uint8)  # any dtype, bfloat16 too: rows travel as bytes
    got = c.alltoallv(raw, [k * row for k in splits]) if row else np.zeros(0, np.uint8)
    return got.view(a.dtype).reshape((int(received.sum()),) + a.shape[1:]), received


def _np_reducescatter(a, op, prescale, postscale):
    """a reduced over the ranks; this rank's share of the rows (the first ranks one more)."""
    c, a = _c(), _contig(a)
    n0 = a.shape[0] if a.ndim else 1
    rows = [n0 // c.size + (r < n0 % c.size) for r in range(c.size)]
    row = int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim else 1
    flat = np.array(a, dtype=_red_dtype(a.dtype), copy=True).reshape(-1)
    if prescale != 1.0:
        flat *= prescale
    mine = c.reduce_scatter(flat, op=op, counts=[k * row for k in rows])
    if postscale != 1.0:
        mine *= postscale
    return mine.reshape((rows[c.rank],) + a.shape[1:]).astype(a.dtype, copy=False)


# ---- TensorFlow level ------------------------------------------------------------------------------

def _np_fn(fn, inputs, touts):
    """fn(*numpy arrays) -> list of arrays, eagerly or as a stateful numpy_function."""
    if tf.executing_eagerly():
        return [tf.convert_to_tensor(x) for x in fn(*[t.numpy() for t in inputs])]
    outs = tf.numpy_function(lambda *xs: fn(*xs), inputs, touts, stateful=True)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _allreduce_dense_list(tensors, op, prescale=1.0, postscale=1.0):
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    outs = _np_fn(lambda *xs: _np_allreduce_many(xs, op, prescale, postscale), tensors,
                  [t.dtype for t in tensors])
    for o, t in zip(outs, tensors):
        o.set_shape(t.shape)
    return outs


def _allreduce_differentiable(tensors, op, prescale, postscale):
    @tf.custom_gradient
    def f(*xs):
        ys = _allreduce_dense_list(list(xs), op, prescale, postscale)

        def grad(*dys):
            if op not in (Average, Sum):
                raise ValueError(f"hbmcoll: allreduce with op {op!r} has no gradient")
            return _allreduce_dense_list([tf.convert_to_tensor(d) for d in dys], op, prescale,
                                         postscale)
        return ys, grad
    out = f(*tensors)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _allreduce_sparse(s, op):
    if op not in (Average, Sum):
        raise ValueError("hbmcoll: IndexedSlices can only be averaged or summed")
    values = allgather(s.values)
    indices = allgather(s.indices)
    if op == Average:
        values = values / tf.cast(size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=s.dense_shape)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=None,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, name=None,
                      sparse_as_dense=False):
    """allreduce of a list of tensors in one fused collective per dtype; None entries stay
    None, tf.IndexedSlices are gathered (or densified with sparse_as_dense=True). With
    compression=Compression.fp16 floating-point tensors travel as float16."""
    op, wire = _op_of(average, op), _wire(compression)
    _unsupported(device_dense=device_dense, device_sparse=device_sparse)
    out = list(tensors)
    dense = []
    for i, t in enumerate(tensors):
        if t is None:
            continue
        if isinstance(t, tf.IndexedSlices):
            if sparse_as_dense:
                out[i] = tf.convert_to_tensor(t)
                dense.append(i)
            continue
        dense.append(i)
    if dense:
        sent = [tf.convert_to_tensor(out[i]) for i in dense]
        own = [t.dtype for t in sent]
        if wire is not None:  # tf.cast is differentiable: gradients travel back the same way
            sent = [tf.cast(t, wire) if t.dtype.is_floating else t for t in sent]
        red = _allreduce_differentiable(sent, op, prescale_factor, postscale_factor)
        for i, r, dt in zip(dense, red, own):
            out[i] = tf.cast(r, dt) if r.dtype != dt else r
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices) and not sparse_as_dense:
            out[i] = _allreduce_sparse(t, op)
    return out


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None,
              op=None, prescale_factor=1.0, postscale_factor=1.0, name=None):
    """tensor reduced over all ranks (default op Average); a new tensor. Differentiable for
    Average and Sum. tf.IndexedSlices are allgathered (Horovod's behaviour)."""
    return grouped_allreduce([tensor], average, device_dense, device_sparse, compression, op=op,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor)[0]


def allgather(tensor, name=None):
    """Every rank's tensor concatenated along dimension 0, in rank order (first dimensions may
    differ). Differentiable: a rank's gradient is its slice of the summed gradient."""
    tensor = tf.convert_to_tensor(tensor)

    @tf.custom_gradient
    def f(x):
        y, = _np_fn(lambda a: [_np_allgather(a)[0]], [x], [x.dtype])
        y.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank
                    else tf.TensorShape([None]))

        def grad(dy):
            summed = _allreduce_dense_list([dy], Sum)[0]
            n = tf.cast(tf.shape(x)[0] if x.shape.rank else 1, tf.int64)
            firsts = _allgather_sizes(n)
            start = tf.reduce_sum(firsts[:rank()])
            g = summed[start:start + n]
            return tf.reshape(g, tf.shape(x))
        return y, grad
    return f(tensor)


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Rows (dimension 0) of tensor, splits[j] of them to rank j (default: evenly); returns the
    rows received from every rank in rank order, and how many came from each. Differentiable."""
    _unsupported(process_set=process_set)
    tensor = tf.convert_to_tensor(tensor)
    if splits is None:
        n0, P = int(tensor.shape[0]), size()
        if n0 % P:
            raise ArgumentError(f"alltoall: {n0} rows do not split evenly over {P} ranks: give splits")
        splits = [n0 // P] * P
    splits = tf.cast(tf.convert_to_tensor(splits), tf.int64)

    @tf.custom_gradient
    def f(x):
        y, received = _np_fn(_np_alltoall_list, [x, splits], [x.dtype, tf.int64])
        y.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))

        def grad(dy, _):
            g, _ = _np_fn(_np_alltoall_list, [dy, received], [dy.dtype, tf.int64])
            return tf.reshape(g, tf.shape(x))
        return (y, received), grad
    return f(tensor)


def _np_alltoall_list(a, splits):
    return list(_np_alltoall(a, splits))


def reducescatter(tensor, device_dense="", compression=None, op=Average, name=None, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """tensor reduced over the ranks (default op Average) and split along dimension 0: this
    rank's share of the rows (the first ranks one more when they do not split evenly).
    Differentiable for Average and Sum."""
    _unsupported(device_dense=device_dense, process_set=process_set)
    op, wire, tensor = _op_of(None, op), _wire(compression), tf.convert_to_tensor(tensor)
    own = tensor.dtype
    if wire is not None and own.is_floating:
        tensor = tf.cast(tensor, wire)

    @tf.custom_gradient
    def f(x):
        y, = _np_fn(lambda a: [_np_reducescatter(a, op, prescale_factor, postscale_factor)], [x], [x.dtype])
        y.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))

        def grad(dy):
            if op not in (Average, Sum):
                raise ValueError(f"hbmcoll: reducescatter with op {op!r} has no gradient")
            g = allgather(dy) * tf.cast(prescale_factor * postscale_factor / (size() if op == Average else 1),
                                         dy.dtype)
            return tf.reshape(g, tf.shape(x))
        return y, grad
    out = f(tensor)
    return tf.cast(out, own) if out.dtype != own else out


def _allgather_sizes(n):
    n = tf.reshape(tf.cast(n, tf.int64), [1])
    out, = _np_fn(lambda a: [_np_allgather(a)[0]], [n], [tf.int64])
    return out


def broadcast(tensor, root_rank, name=None):
    """A new tensor with root_rank's value. Differentiable (the root gets the sum of every
    rank's gradient, the others zero)."""
    tensor = tf.convert_to_tensor(tensor)

    @tf.custom_gradient
    def f(x):
        y, = _np_fn(lambda a: [_np_bcast(a, root_rank)], [x], [x.dtype])
        y.set_shape(x.shape)

        def grad(dy):
            g = _allreduce_dense_list([dy], Sum)[0]
            return g if rank() == root_rank else tf.zeros_like(g)
        return y, grad
    return f(tensor)


def broadcast_variables(variables, root_rank=0):
    """Assign root_rank's values to every rank's variables (one fused broadcast)."""
    variables = list(variables)
    if not variables:
        return None
    values = [v.read_value() if hasattr(v, "read_value") else tf.convert_to_tensor(v)
              for v in variables]
    news = _np_fn(lambda *xs: _np_bcast_many(xs, root_rank), values, [v.dtype for v in values])
    assigns = []
    for var, new, old in zip(variables, news, values):
        new.set_shape(old.shape)
        assigns.append(var.assign(new))
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_object(obj, root_rank=0, name=None):
    """root_rank's obj (pickled) on every rank (eager)."""
    import pickle
    c = _c()
    data = pickle.dumps(obj) if c.rank == root_rank else b""
    n = np.array([len(data)], np.int64)
    c.bcast(n, root=root_rank)
    buf = np.frombuffer(bytearray(data), np.uint8) if c.rank == root_rank \
        else np.empty(int(n[0]), np.uint8)
    if buf.size:
        c.bcast(buf, root=root_rank)
    return obj if c.rank == root_rank else pickle.loads(buf.tobytes())


def allgather_object(obj, name=None):
    """The list of every rank's obj (eager)."""
    import pickle
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    got, firsts = _np_allgather(data)
    out, off = [], 0
    for n in firsts:
        out.append(pickle.loads(got[off:off + int(n)].tobytes()))
        off += int(n)
    return out


# ---- training ------------------------------------------------------------------------------------

class DistributedGradientTape:
    """Wraps a tf.GradientTape: gradient() returns the gradients reduced over the ranks
    (averaged by default) in one fused allreduce. Everything else goes to the tape."""

    def __init__(self, gradtape, device_dense="", device_sparse="", compression=None,
                 sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0,
                 num_groups=0, groups=None, process_set=None):
        self._tape = gradtape
        self._op = _op_of(None, op)
        self._compression = compression
        _wire(compression)
        _unsupported(device_dense=device_dense, device_sparse=device_sparse, num_groups=num_groups, groups=groups,
                     process_set=process_set)
        self._sparse_as_dense = sparse_as_dense
        self._predivide = float(gradient_predivide_factor)
        if self._predivide != 1.0 and self._op != Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        init()

    def gradient(self, target, sources, output_gradients=None, **kw):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kw)
        flat = tf.nest.flatten(grads)
        red = grouped_allreduce(flat, op=self._op, compression=self._compression,
                                prescale_factor=1.0 / self._predivide, postscale_factor=self._predivide,
                                sparse_as_dense=self._sparse_as_dense)
        return tf.nest.pack_sequence_as(grads, red)

    def __getattr__(self, name):
        return getattr(self._tape, name)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=None, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None):
    """A Keras optimizer (Keras 3) that applies the gradients reduced over the ranks (averaged
    by default): a subclass of the optimizer's class made from its config, whose apply() (which
    apply_gradients() and Model.fit use) allreduces the gradients first, in one fused
    collective per dtype."""
    if backward_passes_per_step != 1:
        raise ValueError("hbmcoll: use the Keras optimizer's gradient_accumulation_steps "
                         "instead of backward_passes_per_step")
    op = _op_of(None, op)
    if op not in (Average, Sum):
        raise ValueError("DistributedOptimizer reduces gradients with Average or Sum")
    _wire(compression)
    _unsupported(device_dense=device_dense, device_sparse=device_sparse, num_groups=num_groups, groups=groups,
                 process_set=process_set)
    base = optimizer.__class__
    predivide = float(gradient_predivide_factor)
    init()

    def apply(self, grads, trainable_variables=None):
        grads = grouped_allreduce(list(grads), op=op, compression=compression, prescale_factor=1.0 / predivide,
                                  postscale_factor=predivide, sparse_as_dense=sparse_as_dense)
        return base.apply(self, grads, trainable_variables)

    cls = type(base.__name__, (base,), {"apply": apply, "_hbmcoll_distributed": True,
                                        "__module__": base.__module__})
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


# ---- Keras callbacks (hvd.callbacks.*) ---------------------------------------------------------------

def _make_callbacks():
    import keras

    from . import keras_callbacks
    return keras_callbacks.module(keras, sys.modules[__name__])


class _LazyCallbacks(types.ModuleType):
    """hbmcoll.tensorflow.callbacks, built on first use (importing keras takes seconds)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        real = _make_callbacks()
        self.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
        return getattr(real, name)


callbacks = _LazyCallbacks(__name__ + ".callbacks", "Keras callbacks of hbmcoll.tensorflow")
sys.modules[callbacks.__name__] = callbacks
# `import hbmcoll.tensorflow.keras as hvd` works too, like horovod.tensorflow.keras
sys.modules[__name__ + ".keras"] = sys.modules[__name__]
