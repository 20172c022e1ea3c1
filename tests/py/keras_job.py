"""A rank of a Horovod-style Keras script across emulated nodes (test_across_nodes.py): the
import is the only change from Horovod. Prints "keras ok" when every rank ends with the same
weights (each rank trained on its own data, the gradients averaged across the nodes).
"""
import os
import zlib

import numpy as np
import tensorflow as tf
from tensorflow import keras

import hbmcoll.tensorflow as hvd

hvd.init()
tf.random.set_seed(hvd.rank())  # different starts: the broadcast callback makes them one
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(hvd.rank())
x, y = rng.standard_normal((64, 16)).astype(np.float32), rng.integers(0, 3, 64)
model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
crc = zlib.crc32(b"".join(w.tobytes() for w in model.get_weights()))
assert len(set(hvd.allgather_object(crc))) == 1, "ranks disagree on the weights"
os.write(1, b"keras ok\n")
hvd.shutdown()
