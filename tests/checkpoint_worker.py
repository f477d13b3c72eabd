"""A tiny DP training run that tests/test_checkpoint.py starts, SIGKILLs and resumes in subprocesses.

    python tests/checkpoint_worker.py MODE [--mechanisms lazy,dense] --directory D [--out O]

MODE
  full    train EPOCHS epochs without checkpoints (the uninterrupted run);
  crash   train with DPCheckpoint every EVERY steps; after step HANG_AFTER the
          process writes `D/<mechanism>/hung` and sleeps until it is killed
          (give one mechanism);
  resume  restore the newest complete checkpoint and train to the end.

`full` and `resume` write O/<mode>_<mechanism>.npz: the raw (un-flushed) weights, the weights
after `flush()` (what export releases), the noise generator's state, the
step counters, the ledger JSON, the final epsilon and the restored position.
The model: ids [batch, 2] -> DPEmbedding(VOCAB, 4, mean) -> Dense(1); SGD
with momentum 0.9; Poisson batches (q = 0.025: 40 batches per epoch, 5 epochs);
a PrivacyBudget (RDP) records every step. `build` also makes DP-FEST,
DP-AdaFEST and EANA runs for the in-process tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from tfdp_embed import DPEmbedding, DPModel, keras, tf
from tfdp_embed.accounting import PrivacyBudget
from tfdp_embed.data import poisson_batches, with_lookahead
from tfdp_embed.keras2.checkpointing import DPCheckpoint, rest_of_epoch
from tfdp_embed.mechanisms import DPFEST, EANA, DenseDPSGD, DPAdaFEST, LazyDP

VOCAB, DIM, N, Q, EPOCHS = 50, 4, 200, 0.025, 5  # 40 batches per epoch, 200 steps
# Checkpoints at steps 7, 14, ..., 63; the crash run hangs after step 65 (epoch 1, batch 25).
EVERY, HANG_AFTER = 7, 65
SAMPLER_SEED, NOISE_SEED = 11, 5
TARGET_EPSILON, DELTA = 8.0, 1e-5


def build(
    mechanism_name: str,
    *,
    vocab: int = VOCAB,
    noise_multiplier: float = 1.0,
    sampling_probability: float = Q,
    target_epsilon: float = TARGET_EPSILON,
):
    """(dp_model, batches, budget, wrap, info) with every seed fixed; `wrap` adds the lookahead."""
    keras.utils.set_random_seed(0)
    ids_in = keras.Input((2,), dtype="int32", name="ids")
    hidden = DPEmbedding(vocab, DIM, combiner="mean", name="emb")(ids_in)
    model = keras.Model(ids_in, keras.layers.Dense(1, name="out")(hidden))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (N, 2)).astype("int32")
    labels = (ids.sum(1, keepdims=True) % 2).astype("float32")
    batches, info = poisson_batches(
        tf.data.Dataset.from_tensor_slices((ids, labels)),
        sampling_probability=sampling_probability,
        seed=SAMPLER_SEED,
    )
    kwargs = {
        "l2_norm_clip": 1.0,
        "noise_multiplier": noise_multiplier,
        "seed": NOISE_SEED,
    }
    lazy = mechanism_name == "lazy"
    if mechanism_name == "fest":  # DP top-k selection from the label-independent id counts
        counts = np.bincount(ids.ravel(), minlength=vocab)
        mechanism = DPFEST(**kwargs, selection_epsilon=1.0, top_k=10, counts={"emb": counts})
    elif mechanism_name == "eana":  # not DP: the budget logs a nominal epsilon
        mechanism = EANA(**kwargs)
    elif mechanism_name == "adafest":
        mechanism = DPAdaFEST(
            **kwargs,
            contribution_clip=1.0,
            contribution_noise_multiplier=1.0,
            threshold=3.0,
        )
    else:
        mechanism = LazyDP(**kwargs) if lazy else DenseDPSGD(**kwargs)
    dp = DPModel(
        model,
        mechanism=mechanism,
        expected_batch_size=info.expected_batch_size,
        lookahead=lazy,
    )
    dp.compile(
        optimizer=keras.optimizers.legacy.SGD(0.5, momentum=0.9),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    budget = PrivacyBudget(
        mechanism,
        sampling_probability=sampling_probability,
        target_epsilon=target_epsilon,
        target_delta=DELTA,
        accountant="rdp",
    )

    def wrap(ds):
        return with_lookahead(ds, lambda features: {"emb": features}) if lazy else ds

    # The model is built from fixed batches, not from the sampler: a partial read of a
    # with_lookahead pipeline draws a timing-dependent number of batch seeds (tf.data
    # prefetches), which would shift the sampler's stream differently in every process.
    dp.prepare(wrap(tf.data.Dataset.from_tensor_slices((ids[:8], labels[:8])).batch(4)))
    return dp, batches, budget, wrap, info


class _Hang(keras.callbacks.Callback):
    """Marks the process as hung after step `after` and sleeps (the test kills it)."""

    def __init__(self, directory: str, after: int):
        super().__init__()
        self.directory, self.after, self.steps = directory, after, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps >= self.after:
            with open(os.path.join(self.directory, "hung"), "w") as f:
                f.write(str(self.steps))
            while True:
                time.sleep(1)


def _results(dp, budget, out: str, extra: dict) -> None:
    mechanism = dp.mechanism
    raw = [w.numpy() for w in dp.inner.weights]
    generator_state = mechanism.generator.state.numpy()
    dp.flush()
    flushed = [w.numpy() for w in dp.inner.weights]
    np.savez(
        out,
        **{f"raw_{i}": w for i, w in enumerate(raw)},
        **{f"flushed_{i}": w for i, w in enumerate(flushed)},
        generator_state=generator_state,
        steps=int(mechanism.steps.numpy()),
        iterations=int(dp.optimizer.iterations.numpy()),
        ledger=budget.ledger.to_json(),
        epsilon=budget.spent_epsilon(),
        extra=json.dumps(extra),
    )


def run(mode: str, mechanism_name: str, directory: str, out: str | None) -> int:
    """One mechanism's run in `mode`; returns the exit code."""
    dp, batches, budget, wrap, info = build(mechanism_name)
    if mode == "full":
        dp.fit(wrap(batches), epochs=EPOCHS, callbacks=[budget], verbose=0)
        _results(dp, budget, out, {})
        return 0
    checkpoint = DPCheckpoint(
        directory,
        dp_model=dp,
        budget=budget,
        every_n_steps=EVERY,
        batches_per_epoch=info.batches_per_epoch,
        sampler_seed=SAMPLER_SEED,
    )
    if mode == "crash":
        # DPCheckpoint before PrivacyBudget on purpose: the save waits for the ledger.
        dp.fit(
            wrap(batches),
            epochs=EPOCHS,
            callbacks=[checkpoint, budget, _Hang(directory, HANG_AFTER)],
            verbose=0,
        )
        return 1  # never reached: the test kills the process
    resumed = checkpoint.restore_or_initialize()
    if resumed is None:
        print(f"no checkpoint to resume from in {directory}", file=sys.stderr)
        return 2
    position = resumed.position
    extra = {
        "restored_step": resumed.step,
        "restored_epoch": position.epoch,
        "restored_batch_in_epoch": position.batch_in_epoch,
        "restored_ledger_steps": resumed.ledger.steps,
        "restored_owes_noise": resumed.owes_noise,
        "restored_generator_state": dp.mechanism.generator.state.numpy().tolist(),
    }
    rest = rest_of_epoch(batches, position)
    if rest is not None:
        dp.fit(
            wrap(rest),
            epochs=position.epoch + 1,
            initial_epoch=position.epoch,
            callbacks=[budget, checkpoint],
            verbose=0,
        )
    dp.fit(
        wrap(batches),
        epochs=EPOCHS,
        initial_epoch=position.next_full_epoch,
        callbacks=[budget, checkpoint],
        verbose=0,
    )
    _results(dp, budget, out, extra)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("full", "crash", "resume"))
    parser.add_argument("--mechanisms", default="lazy,dense", help="comma-separated: lazy, dense")
    parser.add_argument("--directory", required=True, help="checkpoints go to DIRECTORY/<mechanism>")
    parser.add_argument("--out", help="results go to OUT/<mode>_<mechanism>.npz")
    args = parser.parse_args(argv)
    for name in args.mechanisms.split(","):
        if name not in ("lazy", "dense"):
            parser.error(f"unknown mechanism {name!r}; allowed: lazy, dense")
        directory = os.path.join(args.directory, name)
        os.makedirs(directory, exist_ok=True)
        out = None if args.out is None else os.path.join(args.out, f"{args.mode}_{name}.npz")
        code = run(args.mode, name, directory, out)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
