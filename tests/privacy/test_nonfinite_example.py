"""Attack (N2): one example with a non-finite loss decides whether training finishes.

A DP step that halts on a NaN or Inf per-example loss releases one bit
per step that no noise covers: "was the example in the batch?". The
attacker plants one example whose loss cannot be finite (a numeric feature
of 1e30; under `mixed_float16` a value >= 65504, which is Inf in float16)
and watches whether training finishes. Over SEEDS seeds (data, weights),
each trained once with the target and once without, the attacker guesses
"in" exactly when training stopped.

Before the fix, training stopped with the target every time and never
without it: the guess is always right. Now an example with a non-finite
loss contributes zero like any clipped contribution: both runs finish,
the guess is right half the time (chance), and with the noise off the
weights trained with the target equal those trained without it (the
target adds 0 to every clipped sum). The target sits in a batch of its
own size + 1; DP-SGD divides by the expected batch size, so the weights
can be compared directly.

Both front ends (the `fe` fixture of tests/conftest.py), except the
`mixed_float16` case: the Keras 3 front end refuses reduced precision.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed import mechanisms

VOCAB, DIM, BATCH, SEEDS, C = 10, 3, 8, 10, 0.5


@pytest.fixture
def policy(request, fe):
    fe.keras.mixed_precision.set_global_policy(request.param)
    yield request.param
    fe.keras.mixed_precision.set_global_policy("float32")


def _model(fe):
    """ids [B, 2] -> mean-pooled DPEmbedding, concatenated with a numeric feature [B, 1] -> Dense(4) -> Dense(1)."""
    keras = fe.keras
    ids = keras.Input((2,), dtype="int32", name="ids")
    number = keras.Input((1,), dtype="float32", name="number")
    pooled = fe.DPEmbedding(VOCAB, DIM, combiner="mean", name="items")(ids)
    hidden = keras.layers.Dense(4, name="hidden")(keras.layers.Concatenate()([pooled, number]))
    return keras.Model([ids, number], keras.layers.Dense(1, dtype="float32", name="out")(hidden))


def _batches(seed: int, target: float | None) -> tf.data.Dataset:
    """Two batches of BATCH examples; with `target`, batch 0 also holds one example of feature `target`."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (2 * BATCH, 2)).astype("int32")
    number = rng.normal(size=(2 * BATCH, 1)).astype("float32")
    labels = rng.normal(size=(2 * BATCH, 1)).astype("float32")
    batches = [(ids[s : s + BATCH], number[s : s + BATCH], labels[s : s + BATCH]) for s in (0, BATCH)]
    if target is not None:
        i, n, y = batches[0]
        batches[0] = (
            np.concatenate([np.array([[1, 2]], "int32"), i]),
            np.concatenate([np.array([[target]], "float32"), n]),
            np.concatenate([np.zeros((1, 1), "float32"), y]),
        )
    data = [tf.data.Dataset.from_tensors(((i, n), y)) for i, n, y in batches]
    return data[0].concatenate(data[1])


def _dense() -> mechanisms.DenseDPSGD:
    return mechanisms.DenseDPSGD(l2_norm_clip=C, noise_multiplier=0.0, seed=0)


def _runs(fe, target_value: float, mechanism=_dense, seeds: int = SEEDS) -> dict:
    """Per seed and dataset ("with", "without"): whether training stopped, and the final weights."""
    dp = fe.dp_model(_model(fe), mechanism(), batch=BATCH, lr=0.5, loss="mse")
    dp.prepare(_batches(0, None))
    out: dict = {"with": [], "without": []}
    for seed in range(seeds):
        init = _init(seed, dp.get_weights())
        for key, target in (("with", target_value), ("without", None)):
            dp.set_weights(init)
            try:
                dp.fit(_batches(seed, target), epochs=1, verbose=0)
                stopped = False
            except tf.errors.InvalidArgumentError:
                stopped = True
            out[key].append((stopped, dp.get_weights()))
    return out


def _attack(runs: dict) -> dict:
    seeds = len(runs["with"])
    stopped_with = sum(s for s, _ in runs["with"])
    stopped_without = sum(s for s, _ in runs["without"])
    accuracy = (stopped_with + seeds - stopped_without) / (2 * seeds)  # guess "in" iff training stopped
    gaps = []
    for (_, with_target), (_, without), seed in zip(runs["with"], runs["without"], range(seeds)):
        moved = max(float(np.max(np.abs(w - b))) for w, b in zip(without, _init(seed, without)))
        gaps.append(max(float(np.max(np.abs(a - b))) for a, b in zip(with_target, without)) / moved)
    return {"stopped_with": stopped_with, "stopped_without": stopped_without, "accuracy": accuracy, "gaps": gaps}


def _init(seed: int, like: list) -> list:
    return [np.random.default_rng(100 + seed).normal(scale=0.3, size=w.shape).astype(w.dtype) for w in like]


def _check(result: dict) -> None:
    # Before the fix: stopped 10/10 with the target, 0/10 without, accuracy 1.0.
    assert result["stopped_with"] == 0 and result["stopped_without"] == 0, result
    assert result["accuracy"] == 0.5, result
    # The target adds exactly 0; what is left is float32 summation order (9 terms instead of 8).
    assert max(result["gaps"]) < 1e-5, result


def test_one_infinite_loss_neither_stops_training_nor_moves_the_weights(fe):
    _check(_attack(_runs(fe, 1e30)))  # 1e30 through two Dense layers: the squared error is Inf


@pytest.mark.parametrize("fe", ["keras2"], indirect=True)  # the Keras 3 front end refuses mixed precision
@pytest.mark.parametrize("policy", ["mixed_float16"], indirect=True)
def test_a_float16_overflowing_feature_neither_stops_training_nor_moves_the_weights(fe, policy):
    _check(_attack(_runs(fe, 70000.0)))  # > 65504: Inf once cast to float16


@pytest.mark.parametrize(
    "mechanism",
    [
        lambda: mechanisms.LazyDP(l2_norm_clip=C, noise_multiplier=0.0, seed=0),
        lambda: mechanisms.DPAdaFEST(
            l2_norm_clip=C,
            noise_multiplier=0.0,
            contribution_clip=1.0,
            contribution_noise_multiplier=1e-6,
            threshold=0.5,
            seed=0,
        ),
    ],
    ids=["lazy", "adafest"],
)
def test_sparse_mechanisms_neither_stop_nor_move_the_weights(fe, mechanism):
    # The target's rows get a zero gradient (and DP-AdaFEST counts them in its contribution map, within C1).
    _check(_attack(_runs(fe, 1e30, mechanism, seeds=3)))


def test_the_control_a_finite_target_moves_the_weights(fe):
    # The same target with a finite feature is an ordinary example: the comparison can see it.
    result = _attack(_runs(fe, 3.0))
    assert result["stopped_with"] == 0 and min(result["gaps"]) > 1e-3, result
