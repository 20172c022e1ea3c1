"""A Keras worker of test_memserver.py: a small classifier on its half of a synthetic set, its
weights shared through the memory servers (ParameterSharingCallback, async). Prints
"keras accuracy A steps S" (A on the whole set, from the shared weights) when all went well.

    keras_sharing_job.py SHARD SHARDS
"""
import os
import sys

import numpy as np
from tensorflow import keras

import hbmcoll.tensorflow as hvd

shard, shards = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(7)
x = rng.standard_normal((2000, 10)).astype(np.float32)
y = (x @ rng.standard_normal(10) > 0).astype(np.int64)
keras.utils.set_random_seed(shard)  # different starts: the first worker's weights win
model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
sharing = hvd.callbacks.ParameterSharingCallback(mode="async", name="keras")
model.fit(x[shard::shards], y[shard::shards], batch_size=50, epochs=3, verbose=0, callbacks=[sharing])
flat = sharing.shared.buffer.read()
sharing._set(flat)
_, acc = model.evaluate(x, y, verbose=0)
os.write(1, f"keras accuracy {acc:.4f} steps {3 * 1000 // 50}\n".encode())
