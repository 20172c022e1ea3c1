"""Keras on hbmcoll, Horovod style: a small CNN learns scikit-learn's digits on every rank.

    python3 -m hbmcoll.run -n 2 examples/keras_digits.py
    torchrun --nproc-per-node 2 examples/keras_digits.py     # any launcher hbmcoll.init() knows

A Horovod Keras script with its import changed (`import hbmcoll.tensorflow as hvd`): each rank
fits on its shard of the 8x8 digit images (shipped with scikit-learn; a synthetic set of the same
shape stands in when it is missing); DistributedOptimizer averages the gradients of every step
over the ranks, BroadcastGlobalVariablesCallback starts all ranks from rank 0's weights and
MetricAverageCallback reports metrics averaged over the ranks. `--check` ends by comparing the
weights of all ranks (they must be equal).
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HBMCOLL_QUIET", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import hbmcoll.tensorflow as hvd  # noqa: E402


def load_digits():
    """(images N x 8 x 8 x 1 float32 in [0, 1], labels N int64)."""
    try:
        from sklearn.datasets import load_digits as sk_digits
        d = sk_digits()
        return (d.images[..., None] / 16.0).astype(np.float32), d.target.astype(np.int64)
    except ImportError:  # synthetic digits: a fixed pattern per class plus noise
        rng = np.random.default_rng(0)
        protos = rng.random((10, 8, 8, 1), dtype=np.float32)
        y = rng.integers(0, 10, 1797)
        x = np.clip(protos[y] + 0.3 * rng.standard_normal((1797, 8, 8, 1)), 0, 1)
        return x.astype(np.float32), y.astype(np.int64)


def build_model():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--check", action="store_true", help="compare the weights of all ranks")
    args = ap.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(1234 + rank)  # deliberately different: the callback syncs

    x, y = load_digits()
    perm = np.random.default_rng(0).permutation(len(y))
    x, y = x[perm], y[perm]
    n_test = len(y) // 5
    x_test, y_test = x[:n_test], y[:n_test]
    x_train, y_train = x[n_test:][rank::size], y[n_test:][rank::size]
    steps = len(y_train) // args.batch   # the same on every rank: fit runs the same collectives
    steps = min(hvd.allgather_object(steps))
    x_train, y_train = x_train[:steps * args.batch], y_train[:steps * args.batch]

    model = build_model()
    # Horovod's advice: scale the learning rate with the number of ranks
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(args.lr * size))
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()]
    model.fit(x_train, y_train, batch_size=args.batch, epochs=args.epochs, shuffle=True,
              callbacks=callbacks, verbose=2 if rank == 0 else 0)
    loss, acc = model.evaluate(x_test, y_test, verbose=0)
    if rank == 0:
        print(f"test accuracy {acc:.3f} (loss {loss:.4f}) after {args.epochs} epochs on "
              f"{size} ranks", flush=True)

    if args.check:
        flat = np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])
        root = hvd.broadcast(tf.constant(flat), root_rank=0).numpy()
        equal = np.array([int(np.array_equal(root, flat))], np.int64)
        hvd.init().allreduce(equal, "min")
        if not equal[0]:
            raise SystemExit(f"rank {rank}: weights differ between ranks")
        if rank == 0:
            print(f"weights equal on all ranks ({flat.size} parameters)", flush=True)


if __name__ == "__main__":
    main()
