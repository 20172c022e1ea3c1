"""hbmcoll.tensorflow: Horovod's TensorFlow/Keras API over hbmcoll, eagerly and in tf.function.

One 2-rank job runs the family of cases (importing TensorFlow costs seconds per process); ranks
return their local results and the test compares across ranks: DistributedGradientTape gives the
average of the ranks' local gradients, broadcast makes variables equal, the collectives match
NumPy, and Keras training with DistributedOptimizer and the callbacks ends with equal weights.
"""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYMOD = os.path.join(REPO, "pymod")
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "HBMCOLL_QUIET": "1",
          "HBMCOLL_TIMEOUT": "120"}   # generous: TensorFlow's first steps are slow on a busy machine


def _local_data(rank, n=16):
    rng = np.random.default_rng(10 + rank)
    return rng.standard_normal((n, 5)).astype(np.float32), rng.integers(0, 3, n)


def rank_tensorflow(comm):
    import tensorflow as tf

    import hbmcoll.tensorflow as hvd

    hvd.init(comm)
    r, P = hvd.rank(), hvd.size()
    out = {}

    # -- DistributedGradientTape: eager and tf.function, dense and sparse (embedding) gradients
    tf.random.set_seed(0)
    w = tf.Variable(tf.random.normal([5, 3], seed=1))
    b = tf.Variable(tf.zeros([3]))
    emb = tf.Variable(tf.random.normal([10, 3], seed=2))
    x, y = _local_data(r)
    ids = tf.constant([r, 3, 3 + r])

    def loss_fn():
        logits = x @ w + b + tf.reduce_sum(tf.gather(emb, ids))
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))

    with tf.GradientTape() as tape:
        loss = loss_fn()
    out["local"] = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, [w, b, emb])]
    with tf.GradientTape() as tape:
        loss = loss_fn()
    grads = hvd.DistributedGradientTape(tape).gradient(loss, [w, b, emb])
    out["sparse_kind"] = type(grads[2]).__name__
    out["eager"] = [tf.convert_to_tensor(g).numpy() for g in grads]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn()
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=True)
        return tape.gradient(loss, [w, b, emb])

    out["graph"] = [g.numpy() for g in step()]
    with tf.GradientTape() as tape:
        loss = loss_fn()
    out["sum"] = [tf.convert_to_tensor(g).numpy() for g in
                  hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(loss, [w, b, emb])]

    # -- broadcast_variables, eager and in a tf.function
    v1 = tf.Variable(tf.fill([4, 2], float(r + 1)))
    v2 = tf.Variable([r, 2 * r], dtype=tf.int64)
    v3 = tf.Variable(float(r))                      # a scalar
    hvd.broadcast_variables([v1, v2, v3], root_rank=1)
    out["bcast"] = [v.numpy() for v in (v1, v2, v3)]
    v4 = tf.Variable(tf.fill([3], float(r)))

    @tf.function
    def bcast_fn():
        hvd.broadcast_variables([v4], root_rank=0)
        return v4.read_value()
    out["bcast_graph"] = bcast_fn().numpy()

    # -- the collectives against NumPy (every rank knows every rank's input)
    def inp(q, dt):
        return (np.arange(6) % 4 + q + 1).astype(dt)

    errs = []
    for dt in ("float32", "float64", "float16", "int32", "int64", "uint8", "int16"):
        for op, fn in ((hvd.Sum, np.sum), (hvd.Min, np.min), (hvd.Max, np.max),
                       (hvd.Product, np.prod), (hvd.Average, np.mean)):
            want = fn(np.stack([inp(q, dt).astype(np.float64) for q in range(P)]), axis=0)
            if op == hvd.Average and dt not in ("float32", "float64", "float16"):
                want = np.trunc(want)
            got = hvd.allreduce(tf.constant(inp(r, dt)), op=op).numpy()
            if got.dtype != np.dtype(dt) or not np.allclose(got.astype(np.float64), want):
                errs.append(f"allreduce {dt} {op}: {got} != {want}")
    got = hvd.allreduce(tf.constant([1.0, 2.0, 3.0], tf.bfloat16) * (r + 1)).numpy()
    if got.dtype != tf.bfloat16.as_numpy_dtype or not np.allclose(got.astype(np.float32),
                                                                  [1.5, 3.0, 4.5]):
        errs.append(f"allreduce bfloat16 {got}")
    got = hvd.allreduce(tf.constant([r == 0, False, True]), op=hvd.Sum).numpy()
    if got.tolist() != [True, False, True]:
        errs.append(f"allreduce bool {got}")
    g = hvd.allgather(tf.fill([r + 1, 2], r)).numpy()
    if g.tolist() != [[0, 0]] + [[1, 1]] * 2:
        errs.append(f"allgather {g}")
    if hvd.broadcast(tf.constant([r, r + 1]), root_rank=1).numpy().tolist() != [1, 2]:
        errs.append("broadcast")
    if hvd.allgather_object({"r": r}) != [{"r": q} for q in range(P)] or \
            hvd.broadcast_object(r, root_rank=1) != 1:
        errs.append("objects")
    out["errs"] = errs

    # -- gradients through the collectives
    xv = tf.Variable([float(r + 1), 2.0])
    with tf.GradientTape(persistent=True) as tape:
        s = hvd.allreduce(xv * xv, op=hvd.Sum)
        a = hvd.allreduce(xv * xv)                      # Average
        gth = hvd.allgather(xv * float(r + 1))
        bc = hvd.broadcast(xv * 3.0, root_rank=0)
    out["d_sum"] = tape.gradient(s, xv).numpy()
    out["d_avg"] = tape.gradient(a, xv).numpy()
    out["d_gather"] = tape.gradient(gth, xv).numpy()
    out["d_bcast"] = tape.gradient(bc, xv).numpy()

    # -- Keras: DistributedOptimizer + callbacks, compiled (tf.function) and eager
    import keras

    def model_fn():
        return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                                 keras.layers.Dense(3)])

    rng = np.random.default_rng(100 + r)
    kx = rng.standard_normal((64, 5)).astype(np.float32)
    ky = (kx[:, 0] > 0).astype(np.int64) + (kx[:, 1] > 0)
    out["keras"] = {}
    for eager in (False, True):
        keras.utils.set_random_seed(50 + r)           # different initial weights per rank
        model = model_fn()
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
        model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      run_eagerly=eager)
        hist = model.fit(kx, ky, batch_size=16, epochs=3, verbose=0, shuffle=False,
                         callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                    hvd.callbacks.MetricAverageCallback()])
        out["keras"][eager] = {
            "weights": np.concatenate([np.ravel(v) for v in model.get_weights()]),
            "opt": np.concatenate([np.ravel(np.asarray(v)) for v in opt.variables]),
            "loss": hist.history["loss"], "cls": type(opt).__name__,
            "is_sgd": isinstance(opt, keras.optimizers.SGD)}
    return out


def test_tensorflow(run_ranks):
    res = run_ranks(2, rank_tensorflow, timeout=300, env=TF_ENV)
    P = len(res)
    mean_local = [np.mean([r["local"][i] for r in res], axis=0) for i in range(3)]
    sum_local = [np.sum([r["local"][i] for r in res], axis=0) for i in range(3)]
    for q, r in enumerate(res):
        assert r["sparse_kind"] == "IndexedSlices"
        for i in range(3):   # average of the ranks' local gradients, eager and in tf.function
            np.testing.assert_allclose(r["eager"][i], mean_local[i], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(r["graph"][i], mean_local[i], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(r["sum"][i], sum_local[i], rtol=1e-5, atol=1e-6)
        assert not r["errs"], r["errs"]
        np.testing.assert_array_equal(r["bcast"][0], np.full((4, 2), 2.0))
        assert r["bcast"][1].tolist() == [1, 2] and r["bcast"][2] == 1.0
        np.testing.assert_array_equal(r["bcast_graph"], np.zeros(3))
        # d/dx of sum_q x_q^2, gradient summed over the ranks: 2 * 2x
        np.testing.assert_allclose(r["d_sum"], 4 * np.array([q + 1, 2.0]))
        np.testing.assert_allclose(r["d_avg"], 2 * np.array([q + 1, 2.0]))
        np.testing.assert_allclose(r["d_gather"], [float(P * (q + 1))] * 2)   # own slice of the sum
        np.testing.assert_allclose(r["d_bcast"], [3.0 * P] * 2 if q == 0 else [0.0, 0.0])
    for eager in (False, True):
        k0, k1 = res[0]["keras"][eager], res[1]["keras"][eager]
        assert k0["is_sgd"] and k0["cls"] == "SGD"
        np.testing.assert_array_equal(k0["weights"], k1["weights"])   # every rank ends equal
        np.testing.assert_array_equal(k0["opt"], k1["opt"])
        assert k0["loss"] == k1["loss"]                               # MetricAverageCallback
        assert k0["loss"][-1] < k0["loss"][0], k0["loss"]             # and it learns
    np.testing.assert_allclose(res[0]["keras"][False]["weights"], res[0]["keras"][True]["weights"],
                               rtol=1e-4, atol=1e-5)                  # graph == eager


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("launcher", ["hbmcoll-run", "torchrun"])
def test_example_keras(launcher, tmp_path):
    script = os.path.join(REPO, "examples", "keras_digits.py")
    args = [script, "--epochs", "1", "--check"]
    if launcher == "hbmcoll-run":
        cmd = [sys.executable, "-m", "hbmcoll.run", "-n", "2", "--bind", "none"] + args
    else:
        pytest.importorskip("torch")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(_free_port())] + args
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HBMCOLL_RANK", "HBMCOLL_SIZE", "HBMCOLL_LOCAL", "HBMCOLL_JOB_KEY"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PYMOD, env.get("PYTHONPATH")]))
    env.update(TF_ENV, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300,
                       cwd=str(tmp_path))
    assert p.returncode == 0, f"{cmd}:\n{p.stdout}\n{p.stderr[-4000:]}"
    assert "weights equal on all ranks" in p.stdout, p.stdout + p.stderr[-3000:]
    assert "test accuracy" in p.stdout


def rank_compression_and_lr(comm):
    """Compression.fp16 travels as float16 and comes back in the tensor's dtype (gradients
    too); arguments that ask for what hbmcoll does not do are refused; the warm-up callback
    moves the learning rate every batch from lr / size to lr, the schedule per epoch."""
    import tensorflow as tf
    import keras
    import hbmcoll
    import hbmcoll.tensorflow as hvd
    hvd.init(comm)
    r, out = hvd.rank(), {}
    t = hvd.allreduce(tf.fill([3], r + 0.5), compression=hvd.Compression.fp16, op=hvd.Sum)
    x = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16)
        y = tf.reduce_sum(x * x * (r + 1))
    out["allreduce"] = (t.dtype.name, t.numpy().tolist(), tape.gradient(y, [x])[0].numpy().tolist())
    got, splits = hvd.alltoall(tf.reshape(tf.range(4.0), (2, 2)) + 100 * r)
    x2 = tf.Variable(tf.ones((4, 1)) * (r + 1))
    with tf.GradientTape() as tp:
        z = tf.reduce_sum(hvd.reducescatter(x2, op=hvd.Sum) * (r + 1))
    out["alltoall"] = (got.numpy().tolist(), splits.numpy().tolist(),
                       hvd.reducescatter(tf.ones((3, 2)) * (r + 1), op=hvd.Sum).numpy().tolist(),
                       tp.gradient(z, x2).numpy().ravel().tolist())
    out["refused"] = []
    for call in (lambda: hvd.allreduce(t, compression="fp16"), lambda: hvd.allreduce(t, device_dense="/gpu:0"),
                 lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), num_groups=2)):
        try:
            call()
            out["refused"].append("accepted")
        except (hbmcoll.ArgumentError, hbmcoll.NotSupportedError) as e:
            out["refused"].append(type(e).__name__)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(round(float(self.model.optimizer.learning_rate), 6))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.4)), loss="mse")
    data = (np.ones((8, 2), np.float32), np.ones((8, 1), np.float32))
    model.fit(*data, batch_size=2, epochs=3, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.LearningRateWarmupCallback(0.4, warmup_epochs=2),
                         hvd.callbacks.LearningRateScheduleCallback(0.4, lambda e: 0.5 ** e, start_epoch=2), Record()])
    out["lr"] = seen
    return out


def test_tensorflow_compression_arguments_and_lr_callbacks(run_ranks):
    for r, got in enumerate(run_ranks(2, rank_compression_and_lr, timeout=300, env=TF_ENV)):
        # the tape averages d/dx of (r + 1) x^2 over the ranks: 2x (1 + 2) / 2
        assert got["allreduce"] == ("float32", [2.0] * 3, [3.0, 6.0]), got
        assert got["refused"] == ["ArgumentError", "NotSupportedError", "NotSupportedError"]
        # row r of every rank comes to rank r; 3 rows reduce-scattered as 2 + 1; the gradient
        # of rank q's rows weighted by q + 1 reaches every rank's input
        assert got["alltoall"] == ([[2.0 * r, 2.0 * r + 1], [100 + 2.0 * r, 101 + 2.0 * r]], [1, 1],
                                   [[3.0, 3.0]] * (2 - r), [1.0, 1.0, 2.0, 2.0]), got["alltoall"]
        warm = [0.4 / 2 * ((e + b / 4) * (2 - 1) / 2 + 1) for e in range(2) for b in range(4)]
        assert got["lr"] == [round(v, 6) for v in warm] + [0.1] * 4, got["lr"]
