"""Re-Attention's error propagation checked by Monte Carlo on a tiny DPFormer (DPFormer Alg. 1, eq. 7-9, Lemma A.4).

    python -m benchmarks.reattention_check --samples 2000

The model tracks, for every token, the per-coordinate variance its
activations get when every parameter is a Gaussian around its value with
the effective error as std (item rows: sigma_eff(E_i); everything else:
sigma_eff(W); `SASRec.trace_errors`). Here the same parameters are sampled
that way, the vanilla forward pass is run on each sample, and each stage's
variance across samples is measured; the table prints tracked vs measured
per stage, and for the attention scores s = q k / sqrt(d) over visible
pairs: twice Re-Attention's correction (C sigma_k^2, the score variance the
noisy keys bring, which is what eq. 4 removes as exp(C sigma_k^2 / 2)) vs the
measured variance of s, in which the query's noise also shows. Layer-norm
gains and biases are not noised unless `--noise-layer-norm` (the tracker
ignores their noise). Nothing here is timed.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.attention import effective_errors
from tfdp_embed.keras2.models.sasrec import SASRec, SASRecConfig

ITEMS, MAX_LEN, DIM = 40, 8, 16
SCORES = "score_log_bias"  # trace stage: the raw scores q k / sqrt(d) and Re-Attention's correction


def tiny_model(seed: int, *, error_scale: float) -> tuple[SASRec, np.ndarray]:
    """A 2-block DPFormer with O(1) embeddings and effective errors s / p_i (items), s (weights); and its ids."""
    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)  # Python, numpy and TF: Keras' initialisers draw from all three
    model = SASRec(SASRecConfig(num_items=ITEMS, max_len=MAX_LEN, dim=DIM, blocks=2, dropout=0.0, re_attention=True))
    ids = rng.integers(1, ITEMS + 1, (6, MAX_LEN)).astype(np.int32)
    for row, pad in enumerate((0, 0, 2, 3, 5, 6)):
        ids[row, :pad] = 0
    model(ids)
    model.items.embeddings.assign(rng.normal(0, 0.6, model.items.embeddings.shape).astype(np.float32))
    model.positions.embeddings.assign(rng.normal(0, 0.3, model.positions.embeddings.shape).astype(np.float32))
    for var in model.trainable_variables:
        if "bias" in var.name or "beta" in var.name:
            var.assign(rng.normal(0, 0.1, var.shape).astype(np.float32))
    frequencies = np.concatenate([[0.0], rng.uniform(0.05, 1.0, ITEMS)])
    item_errors, weight_error = effective_errors(
        noise_multiplier=error_scale, batch_size=1.0, item_frequencies=frequencies
    )
    model.set_effective_errors(item_errors, weight_error)
    return model, ids


def _noised(model: SASRec, rng: np.random.Generator, *, noise_layer_norm: bool) -> list:
    """Adds one draw of the parameter noise in place; returns the clean values to restore."""
    clean = [v.numpy() for v in model.trainable_variables]
    item_std = model.item_errors.numpy()[:, None]
    weight_std = float(model.weight_error.numpy())
    for var, value in zip(model.trainable_variables, clean):
        if var is model.items.embeddings:
            std = item_std
        elif "norm" in var.name and not noise_layer_norm:
            continue
        else:
            std = weight_std
        var.assign(value + (std * rng.standard_normal(value.shape)).astype(np.float32))
    return clean


def monte_carlo(model: SASRec, ids, *, samples: int, seed: int, noise_layer_norm: bool = False) -> dict:
    """Per stage: measured per-token variance `[B, L]` (mean over coordinates), or the scores' log-bias `[B, L, L]`."""
    rng = np.random.default_rng(seed)
    clean_stages = model.trace_errors(ids, apply_correction=False)
    sums = {k: 0.0 for k in clean_stages}
    squares = {k: 0.0 for k in clean_stages}
    for _ in range(samples):
        clean = _noised(model, rng, noise_layer_norm=noise_layer_norm)
        stages = model.trace_errors(ids, apply_correction=False)
        for var, value in zip(model.trainable_variables, clean):
            var.assign(value)
        for k, (activation, _) in stages.items():
            sums[k] = sums[k] + activation
            squares[k] = squares[k] + np.square(activation, dtype=np.float64)
    measured = {}
    for k in clean_stages:
        variance = (squares[k] / samples - np.square(sums[k] / samples)) * samples / (samples - 1)
        measured[k] = variance if k.endswith(SCORES) else np.mean(variance, axis=-1)
    return measured


def compare(model: SASRec, ids, measured: dict) -> list[dict]:
    """One row per stage: mean tracked and measured value over real tokens (visible pairs for the score bias)."""
    tracked = model.trace_errors(ids, apply_correction=False)
    mask = ids > 0
    visible = mask[:, :, None] & mask[:, None, :] & np.tril(np.ones((MAX_LEN, MAX_LEN), bool))[None]
    rows = []
    for stage, (_, variance) in tracked.items():
        select = visible if stage.endswith(SCORES) else mask
        if stage.endswith(SCORES):  # the correction is C sigma_k^2 / 2: twice it is the score variance keys bring
            stage, variance = stage.replace(SCORES, "scores (key noise)"), 2.0 * variance
            measured = {**measured, stage: measured[stage.replace("scores (key noise)", SCORES)]}
        t, m = float(np.mean(variance[select])), float(np.mean(measured[stage][select]))
        per_token = variance[select] / np.maximum(measured[stage][select], 1e-30)
        rows.append(
            {
                "stage": stage,
                "tracked": t,
                "measured": m,
                "ratio": t / m if m > 0 else float("nan"),
                "median_token_ratio": float(np.median(per_token)),
            }
        )
    return rows


def real_scale(path: str, *, noise_multiplier: float, batch: int, max_len: int, users: int, seed: int) -> dict:
    """Re-Attention's correction at a real run's effective errors, on the freshly initialised model (no training).

    Exact item frequencies (the most favourable case; a DP release only adds noise to them), DPFormer's
    architecture at the pipeline's defaults, the first `users` training sequences.
    """
    from tfdp_embed.data.sequences import load_sequences

    data = load_sequences(path, max_len=max_len)
    tf.random.set_seed(seed)
    model = SASRec(SASRecConfig(num_items=data.num_items, max_len=max_len, dropout=0.0, re_attention=True))
    p = np.minimum(data.item_user_counts() / data.num_users, 1.0)
    item_errors, weight_error = effective_errors(
        noise_multiplier=noise_multiplier, batch_size=batch, item_frequencies=p, min_frequency=1.0 / data.num_users
    )
    model.set_effective_errors(item_errors, weight_error)
    ids = data.train_inputs[:users]
    stages = model.trace_errors(ids)
    mask = ids > 0
    visible = mask[:, :, None] & mask[:, None, :] & np.tril(np.ones((max_len, max_len), bool))[None]
    out = {"weight_error": weight_error, "item_error_quantiles": np.quantile(item_errors[1:], [0.5, 0.9, 0.99])}
    for name in ("block0", "block1"):
        correction = stages[f"{name}.{SCORES}"][1][visible]
        out[name] = {
            "correction_quantiles": np.quantile(correction, [0.1, 0.5, 0.9]),
            "share_of_pairs_damped_below_1pct": float(np.mean(correction > np.log(100.0))),
        }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reattention_check", description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--error-scale", type=float, default=0.02, help="sigma_eff(W); item rows get it / p_i")
    p.add_argument("--noise-layer-norm", action="store_true", help="also noise layer-norm gains and biases")
    p.add_argument("--real-data", help="SASRec-format file: print the correction at --real-sigma / --real-batch")
    p.add_argument("--real-sigma", type=float, default=0.4393, help="the run's noise multiplier")
    p.add_argument("--real-batch", type=int, default=256)
    p.add_argument("--real-max-len", type=int, default=10)
    a = p.parse_args(argv)
    if a.real_data:
        scale = real_scale(
            a.real_data,
            noise_multiplier=a.real_sigma,
            batch=a.real_batch,
            max_len=a.real_max_len,
            users=512,
            seed=a.seed,
        )
        print(f"{a.real_data}: sigma {a.real_sigma}, batch {a.real_batch}, L {a.real_max_len}, initial weights")
        for key, value in scale.items():
            print(f"  {key}: {value}")
        return 0
    model, ids = tiny_model(a.seed, error_scale=a.error_scale)
    measured = monte_carlo(model, ids, samples=a.samples, seed=a.seed + 1, noise_layer_norm=a.noise_layer_norm)
    print(
        f"tiny DPFormer: {ITEMS} items, L={MAX_LEN}, d={DIM}, 2 blocks; sigma_eff(W)={a.error_scale:g}, "
        f"items / p_i (p in [0.05, 1]); {a.samples} Monte-Carlo samples; layer norm noised: {a.noise_layer_norm}"
    )
    print(f"{'stage':28s} {'tracked':>11s} {'measured':>11s} {'ratio':>7s} {'median token ratio':>19s}")
    for r in compare(model, ids, measured):
        print(
            f"{r['stage']:28s} {r['tracked']:11.4g} {r['measured']:11.4g} {r['ratio']:7.3f} {r['median_token_ratio']:19.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
