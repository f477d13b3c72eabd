"""Re-Attention's error tracking: effective errors and their propagation (DPFormer §4.2).

DP noise makes every parameter a Gaussian around its noise-free value. The
*effective error* of a parameter is the noise std per unit of signal it
gets per step (Definition 4.1, Claims 4.3-4.4):

    sigma_eff(W)   = sigma_dp / B             (every example reaches a block weight)
    sigma_eff(E_i) = sigma_dp / (B * p_i)     (item i is in a sequence with probability p_i)

Tracking the variance of every activation from there, with the noisy
parameters standing in for their means (§4.2.2, "one-time Markov chain
sampling"), gives the variance sigma_j^2 of each attention key, and
Re-Attention removes the multiplicative bias exp(C sigma_j^2 / 2) that it
puts on attention scores (eq. 4/26), C = <q, q> (here <q, q>/d, because the
scores are scaled by 1/sqrt(d)).

Propagation rules (all variances are per coordinate; the DP noise is
isotropic, so one scalar per token suffices):

    product   Var[XW] = Var X Var W + Var X (E W)^2 + Var W (E X)^2           (eq. 7 / Lemma A.3)
    Dense     v_out = d_in v s_W^2 + v ||W||_F^2 / d_out + s_W^2 ||mu||^2 (+ s_W^2 bias)   (eq. 7 summed
              over d_in inputs, averaged over the d_out outputs)
    ReLU      Var = (c^2 + d) Phi(c/sqrt d) + c sqrt(d) phi(c/sqrt d) - E[Z]^2,
              E[Z] = c Phi(c/sqrt d) + sqrt(d) phi(c/sqrt d)                 (eq. 8 / Lemma A.4)
    LayerNorm v_out = v mean(gamma^2) (d - 2) / d / (Var_features(x) + eps)   (first order: the
              centring and the scaling remove 2 of the d noise directions; the paper gives no rule)
    attention v_out_i = sum_j A_ij^2 v_j (attention weights held fixed), residual: variances add.

Note on eq. 8: the paper prints "... - c^2"; with c = 0, d = 1 that gives
0.5, not the 0.3408 of its own Table 3. Lemma A.4 (which the text says eq. 8
follows from) gives E[Z^2] - E[Z]^2 = 0.3408, which is what is implemented.

Everything here is a forward-pass statistic; callers wrap it in
`tf.stop_gradient` so per-example clipping stays exact (the correction is a
constant of the backward pass). It depends on one example only and on the
public (or privately released) item frequencies, so it costs no privacy
(DPFormer Claim A.6).

References: DPFormer §4.2, App. A.4-A.7 and Alg. 1; Wang et al. 2016
(natural-parameter networks).
"""

from __future__ import annotations

import math

import numpy as np

from tfdp_embed.keras2._keras import tf

_SQRT_2PI = math.sqrt(2.0 * math.pi)


def effective_errors(
    *,
    noise_multiplier: float,
    batch_size: float,
    item_frequencies,
    min_frequency: float | None = None,
    error_scale: float = 1.0,
) -> tuple[np.ndarray, float]:
    """Effective errors of item embeddings and of every other weight (Claims 4.3, 4.4).

    sigma_eff(E_i) = s sigma_dp / (B max(p_i, p_min)),  sigma_eff(W) = s sigma_dp / B.

    Args:
      noise_multiplier: sigma_dp >= 0 (0: non-private, all errors 0).
      batch_size: B > 0, the expected batch size.
      item_frequencies: `[V + 1]` p_i in [0, 1] (P[item i occurs in a
        training sequence]; index 0 = padding, its error is 0).
      min_frequency: floor p_min > 0 for items never seen (default: the
        smallest positive frequency).
      error_scale: s > 0, multiplies every effective error (1 = the paper).

    Returns:
      `(item_errors [V + 1] float32, weight_error float)`.

    Raises:
      ValueError: a negative noise multiplier, non-positive batch or scale,
        frequencies outside [0, 1] or all zero.
    """
    if not noise_multiplier >= 0:
        raise ValueError(f"`noise_multiplier` must be >= 0; received {noise_multiplier!r}.")
    if not batch_size > 0:
        raise ValueError(f"`batch_size` must be > 0; received {batch_size!r}.")
    if not error_scale > 0:
        raise ValueError(f"`error_scale` must be > 0; received {error_scale!r}.")
    p = np.asarray(item_frequencies, np.float64)
    if p.ndim != 1 or p.size < 2 or np.any(~np.isfinite(p)) or p.min() < 0 or p.max() > 1:
        raise ValueError(
            "`item_frequencies` must be a 1-D array [items + 1] of probabilities in [0, 1]; received "
            f"shape {p.shape}, range [{np.nanmin(p) if p.size else None}, {np.nanmax(p) if p.size else None}]."
        )
    positive = p[1:][p[1:] > 0]
    if min_frequency is None:
        if positive.size == 0:
            raise ValueError("`item_frequencies` are all zero; pass `min_frequency`.")
        min_frequency = float(positive.min())
    if not 0 < min_frequency <= 1:
        raise ValueError(f"`min_frequency` must lie in (0, 1]; received {min_frequency!r}.")
    scale = error_scale * noise_multiplier / batch_size
    item_errors = scale / np.maximum(p, min_frequency)
    item_errors[0] = 0.0
    return item_errors.astype(np.float32), float(scale)


def product_variance(x_mean, x_var, w_mean, w_var):
    """Var[X W] for independent X, W (eq. 7): Var X Var W + Var X E[W]^2 + Var W E[X]^2."""
    return x_var * w_var + x_var * tf.square(w_mean) + w_var * tf.square(x_mean)


def dense_output_variance(x_mean, x_var, kernel, weight_var, *, use_bias: bool = True):
    """Per-token output variance of x W + b (eq. 7 summed over inputs, mean over outputs).

    v_out = d_in v s_W^2 + v ||W||_F^2 / d_out + s_W^2 ||mu||^2 (+ s_W^2 for the bias).

    Args:
      x_mean: `[..., d_in]` the input (its mean).
      x_var: `[...]` per-coordinate input variance, one scalar per token.
      kernel: `[d_in, d_out]` the (noisy) weights, taken as their mean.
      weight_var: scalar s_W^2, the weights' (and bias') variance.
      use_bias: add the bias variance.

    Returns:
      `[...]` the per-coordinate output variance.
    """
    kernel = tf.cast(kernel, x_mean.dtype)
    d_in, d_out = float(kernel.shape[0]), float(kernel.shape[1])
    w_sq = tf.reduce_sum(tf.square(kernel)) / d_out
    out = x_var * (d_in * weight_var + w_sq) + weight_var * tf.reduce_sum(tf.square(x_mean), axis=-1)
    if use_bias:
        out = out + weight_var
    return out


def relu_moments(mean, var):
    """(E[Z], Var[Z]) of Z = ReLU(X), X ~ N(mean, var) elementwise (eq. 8, Lemma A.4)."""
    var = tf.maximum(var, 1e-30)
    std = tf.sqrt(var)
    ratio = mean / std
    cdf = 0.5 * (1.0 + tf.math.erf(ratio / math.sqrt(2.0)))
    pdf = tf.exp(-0.5 * tf.square(ratio)) / _SQRT_2PI
    first = mean * cdf + std * pdf
    second = (tf.square(mean) + var) * cdf + mean * std * pdf
    return first, tf.maximum(second - tf.square(first), 0.0)


def layer_norm_output_variance(x, x_var, gamma, epsilon: float = 1e-3):
    """First-order variance after LayerNorm over the last axis.

    v_out = v mean(gamma^2) (d - 2) / d / (Var_features(x) + eps): isotropic noise of
    variance v loses its component along the all-ones direction (centring) and
    along x - mean (the scale), 2 of d directions.
    """
    d = float(x.shape[-1])
    _, feature_var = tf.nn.moments(x, axes=[-1])
    gain = tf.reduce_mean(tf.square(tf.cast(gamma, x.dtype))) if gamma is not None else 1.0
    return x_var * gain * (max(d - 2.0, 0.0) / d) / (feature_var + epsilon)


def attention_output_variance(weights, value_var):
    """v_out_i = sum_j A_ij^2 v_j for attention weights `[B, L, L]` and value variances `[B, L]`."""
    weights = tf.convert_to_tensor(weights)
    return tf.einsum("bij,bj->bi", tf.square(weights), tf.cast(value_var, weights.dtype))


def re_attention_correction(query, key_var):
    """Log-score correction C_i sigma_j^2 / 2 with C_i = ||q_i||^2 / d (scores scaled by 1/sqrt d).

    Subtracting it from the attention logits divides each unnormalised score
    exp(<q_i, k_j>/sqrt d) by exp(C_i sigma_j^2 / 2) before the softmax
    normalises (Alg. 1 line 8; eq. 4).

    Args:
      query: `[B, L, d]` queries.
      key_var: `[B, L]` per-coordinate variance of each key.

    Returns:
      `[B, L, L]` (query i, key j).
    """
    query = tf.convert_to_tensor(query)
    key_var = tf.cast(key_var, query.dtype)
    d = float(query.shape[-1])
    c = tf.reduce_sum(tf.square(query), axis=-1) / d  # [B, L]
    return 0.5 * c[:, :, None] * key_var[:, None, :]


__all__ = [
    "attention_output_variance",
    "dense_output_variance",
    "effective_errors",
    "layer_norm_output_variance",
    "product_variance",
    "re_attention_correction",
    "relu_moments",
]
