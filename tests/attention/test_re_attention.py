"""Re-Attention error propagation vs Monte-Carlo sampling (DPFormer Table 3 shape), and the layer."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import tf
from tfdp_embed.keras2.attention import (
    CausalSelfAttention,
    attention_output_variance,
    dense_output_variance,
    effective_errors,
    layer_norm_output_variance,
    product_variance,
    re_attention_correction,
    relu_moments,
)

SAMPLES = 1_000_000


@pytest.mark.parametrize(
    "std, paper_relu",
    # DPFormer Table 3, "Analytic" column: input N(0, std) -> Var[ReLU]
    [(0.01, 3.40e-5), (0.1, 0.0034), (1.0, 0.3408)],
)
def test_relu_variance_matches_table3_and_sampling(std, paper_relu):
    _, var = relu_moments(tf.constant(0.0, tf.float64), tf.constant(std**2, tf.float64))
    # analytic: std^2 (1/2 - 1/(2 pi)) = 0.34085 std^2
    assert float(var) == pytest.approx(std**2 * (0.5 - 1 / (2 * np.pi)), rel=1e-9)
    assert float(var) == pytest.approx(paper_relu, rel=3e-3)  # the paper rounds to 2-4 digits
    x = np.random.default_rng(0).normal(0.0, std, SAMPLES)
    sampled_relu = np.maximum(x, 0).var()
    # Monte-Carlo std error of a variance estimate with 1e6 samples is ~0.2%: 1% tolerance
    assert float(var) == pytest.approx(sampled_relu, rel=1e-2)
    # GELU is approximated by the ReLU rule (Remark A.5): within 10% of GELU's sampled variance at
    # these inputs (Table 3: 2.49e-5 vs 3.40e-5 at std 0.01 is the worst case, 27% apart)
    sampled_gelu = tf.nn.gelu(tf.constant(x)).numpy().var()
    assert abs(float(var) - sampled_gelu) / sampled_gelu < 0.4


@pytest.mark.parametrize("mean, std", [(0.7, 0.3), (-0.5, 1.2), (2.0, 0.5)])
def test_relu_moments_nonzero_mean(mean, std):
    first, var = relu_moments(tf.constant(mean, tf.float64), tf.constant(std**2, tf.float64))
    z = np.maximum(np.random.default_rng(1).normal(mean, std, SAMPLES), 0)
    assert float(first) == pytest.approx(z.mean(), rel=1e-2, abs=1e-3)
    assert float(var) == pytest.approx(z.var(), rel=1e-2, abs=1e-4)


def test_product_variance_eq7_vs_sampling():
    rng = np.random.default_rng(2)
    mx, sx, mw, sw = 0.8, 0.3, -1.5, 0.2
    x, w = rng.normal(mx, sx, SAMPLES), rng.normal(mw, sw, SAMPLES)
    analytic = float(product_variance(mx, sx**2, mw, sw**2))
    # hand value: 0.09*0.04 + 0.09*2.25 + 0.04*0.64 = 0.2317
    assert analytic == pytest.approx(0.2317)
    assert analytic == pytest.approx((x * w).var(), rel=1e-2)


def test_dense_then_relu_propagation_vs_sampling():
    """x + noise -> Dense with noisy weights -> ReLU: the per-token propagated variance vs sampling."""
    rng = np.random.default_rng(3)
    d_in, d_out, n = 8, 6, 20_000
    x_mean = rng.normal(size=(3, d_in))
    kernel = rng.normal(size=(d_in, d_out)) * 0.5
    bias = rng.normal(size=d_out) * 0.1
    x_var, w_var = np.array([0.05, 0.2, 0.0]), 0.01
    xs = x_mean[None] + rng.normal(size=(n, 3, d_in)) * np.sqrt(x_var)[None, :, None]
    ws = kernel[None] + rng.normal(size=(n, d_in, d_out)) * np.sqrt(w_var)
    bs = bias[None] + rng.normal(size=(n, d_out)) * np.sqrt(w_var)
    z = np.einsum("nti,nio->nto", xs, ws) + bs[:, None]
    predicted = dense_output_variance(tf.constant(x_mean), tf.constant(x_var), tf.constant(kernel), w_var).numpy()
    np.testing.assert_allclose(predicted, z.var(axis=0).mean(axis=-1), rtol=0.05)
    pre_mean = x_mean @ kernel + bias
    _, relu_var = relu_moments(tf.constant(pre_mean), tf.constant(predicted)[:, None])
    # per token the coordinate variances differ; the rule gives each coordinate the token mean
    sampled = np.maximum(z, 0).var(axis=0).mean(axis=-1)
    np.testing.assert_allclose(relu_var.numpy().mean(axis=-1), sampled, rtol=0.25)


def test_layer_norm_and_attention_rules():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 3, 16)) * 2.0
    v = np.full((2, 3), 1e-4)
    gamma = np.ones(16) * 0.5
    out = layer_norm_output_variance(tf.constant(x), tf.constant(v), tf.constant(gamma), 0.0).numpy()
    np.testing.assert_allclose(out, v * 0.25 * (14 / 16) / x.var(axis=-1), rtol=1e-10)
    # small-noise sampling check of the first-order rule
    noisy = x[None] + rng.normal(size=(50_000, 2, 3, 16)) * 1e-2
    normed = (noisy - noisy.mean(-1, keepdims=True)) / noisy.std(-1, keepdims=True) * 0.5
    np.testing.assert_allclose(out, normed.var(axis=0).mean(-1), rtol=0.02)
    weights = np.array([[[1.0, 0.0], [0.5, 0.5]]])
    np.testing.assert_allclose(
        attention_output_variance(tf.constant(weights), tf.constant([[2.0, 4.0]], tf.float64)).numpy(), [[2.0, 1.5]]
    )


def test_effective_errors():
    p = np.array([0.0, 0.5, 0.01, 0.0])
    items, weight = effective_errors(noise_multiplier=2.0, batch_size=100, item_frequencies=p)
    assert weight == pytest.approx(0.02)  # sigma_dp / B
    np.testing.assert_allclose(items, [0.0, 0.04, 2.0, 2.0], rtol=1e-6)  # unseen item floored at p_min=0.01
    items, weight = effective_errors(noise_multiplier=0.0, batch_size=100, item_frequencies=p)
    assert weight == 0 and not items.any()  # non-private: no correction
    for bad in (dict(noise_multiplier=-1.0), dict(batch_size=0), dict(item_frequencies=[0.0, 2.0])):
        kwargs = dict(noise_multiplier=1.0, batch_size=10, item_frequencies=p) | bad
        with pytest.raises(ValueError, match="must"):
            effective_errors(**kwargs)


def test_correction_in_attention_expectation():
    """E over a noisy key of exp(<q,K>/sqrt d - C sigma^2/2) equals the noise-free score (eq. 4)."""
    rng = np.random.default_rng(5)
    d, sigma2 = 4, 0.3
    q, k = rng.normal(size=d), rng.normal(size=d)
    keys = k[None] + rng.normal(size=(SAMPLES, d)) * np.sqrt(sigma2)
    correction = re_attention_correction(tf.constant(q[None, None]), tf.constant([[sigma2]])).numpy()[0, 0, 0]
    assert correction == pytest.approx(0.5 * q @ q / d * sigma2)
    corrected = np.exp(keys @ q / np.sqrt(d) - correction).mean()
    assert corrected == pytest.approx(np.exp(q @ k / np.sqrt(d)), rel=1e-2)


def test_causal_attention_masks_future_and_padding():
    layer = CausalSelfAttention()
    rng = np.random.default_rng(6)
    q = tf.constant(rng.normal(size=(1, 4, 3)), tf.float32)
    mask = tf.constant([[0, 1, 1, 1]])
    weights = layer.attention_weights(q, q, key_mask=mask).numpy()[0]
    assert np.all(np.isfinite(weights))
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    assert np.all(weights[1:, 0] == 0) and np.all(np.triu(weights[1:, 1:], 1) == 0)
    # a huge correction on key 2 removes its weight for the later queries
    corr = np.zeros((1, 4, 4), np.float32)
    corr[..., 2] = 1e4
    weights = layer.attention_weights(q, q, key_mask=mask, correction=corr).numpy()[0]
    assert weights[3, 2] < 1e-6 and weights[3, 1] + weights[3, 3] == pytest.approx(1.0, rel=1e-5)
    assert not layer.trainable_weights
    with pytest.raises(ValueError, match="dropout"):
        CausalSelfAttention(dropout=1.0)
    with pytest.raises(ValueError, match=r"\[batch, length, dim\]"):
        layer.attention_weights(q[0], q[0])
