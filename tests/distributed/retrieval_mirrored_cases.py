"""Retrieval and two-tower models under MirroredStrategy on 2 logical CPUs (issue 34), run by a test.

Each case trains the same model with zero noise and a huge clip on one
device and on two replicas (built and compiled in the strategy scope, as a
user does) and reports the largest weight difference; the retrieval cases
also evaluate the top-k metrics both ways.

    python tests/distributed/retrieval_mirrored_cases.py retrieval_full retrieval_sampled two_tower
"""

from __future__ import annotations

import json
import sys

import numpy as np

from tfdp_embed.keras2._keras import keras, tf

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

from tests.retrieval.user_model import MovielensModel, movielens_like  # noqa: E402
from tfdp_embed.keras2.models.two_tower import TwoTowerModel, two_tower_registry  # noqa: E402
from tfdp_embed.keras2.retrieval import FullSoftmax, SampledSoftmax  # noqa: E402
from tfdp_embed.keras2.training import DPModel  # noqa: E402
from tfdp_embed.mechanisms import DenseDPSGD  # noqa: E402

BATCH = 16
_STRATEGY = []


def _strategy():
    if not _STRATEGY:
        _STRATEGY.append(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    return _STRATEGY[0]


def _exact_mechanism():
    return DenseDPSGD(l2_norm_clip=1e6, noise_multiplier=0.0, seed=1)


def _fit(build, strategy, data, registry=None):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = build()
        dp = DPModel(model, mechanism=_exact_mechanism(), expected_batch_size=BATCH, registry=registry)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5))
    dp.fit(data, epochs=1, verbose=0)
    return model, dp


def _spread(model) -> float:
    spread = 0.0
    for var in model.trainable_variables:
        copies = [v.numpy() for v in getattr(var, "values", [var])]
        spread = max(spread, max(float(np.abs(c - copies[0]).max()) for c in copies))
    return spread


def _compare(build, data, registry=None, evaluate=None) -> dict:
    one, dp_one = _fit(build, tf.distribute.get_strategy(), data(), registry)
    two, dp_two = _fit(build, _strategy(), data(), registry)
    out = {
        "max_abs_diff": max(float(np.abs(a - b).max()) for a, b in zip(one.get_weights(), two.get_weights())),
        "moved": max(float(np.abs(a).max()) for a in two.get_weights()),
        "replica_spread": _spread(two),
    }
    if evaluate is not None:
        out["metrics"] = [dp.evaluate(evaluate(), verbose=0, return_dict=True) for dp in (dp_one, dp_two)]
    return out


def _retrieval(negatives) -> dict:
    data = lambda: tf.data.Dataset.from_tensor_slices(movielens_like(4 * BATCH)).batch(BATCH)  # noqa: E731
    held_out = lambda: tf.data.Dataset.from_tensor_slices(movielens_like(64, seed=1)).batch(BATCH)  # noqa: E731
    return _compare(lambda: MovielensModel(negatives), data, evaluate=held_out)


def case_retrieval_full() -> dict:
    return _retrieval(FullSoftmax())


def case_retrieval_sampled() -> dict:
    result = _retrieval(SampledSoftmax(12, seed=5))
    return result


def case_two_tower() -> dict:
    rng = np.random.default_rng(0)
    contexts = rng.integers(0, 21, (4 * BATCH, 5)).astype("int32")
    contexts[:, 0] = rng.integers(1, 21, 4 * BATCH)  # at least one real id
    labels = rng.integers(1, 21, 4 * BATCH).astype("int32")
    data = lambda: tf.data.Dataset.from_tensor_slices((contexts, labels)).batch(BATCH)  # noqa: E731
    build = lambda: TwoTowerModel(num_items=20, embedding_dim=8, hidden_units=(8,))  # noqa: E731
    return _compare(build, data, registry=two_tower_registry())


def main(names):
    results = {name: globals()[f"case_{name}"]() for name in names}
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
