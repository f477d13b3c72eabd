"""Attention for DP Transformers: weight-free causal attention and Re-Attention (DPFormer §4).

Modules: `causal_attention` (the layer), `re_attention` (effective errors,
variance propagation, the score correction), `item_frequencies` (privately
released item frequencies p_i with the release's DP event, or public ones read from a file).
"""

from tfdp_embed.keras2.attention.causal_attention import CausalSelfAttention
from tfdp_embed.keras2.attention.item_frequencies import (
    ItemFrequencies,
    ItemFrequencyFileError,
    exact_item_frequencies,
    private_item_frequencies,
    public_item_frequencies,
    read_item_frequencies,
)
from tfdp_embed.keras2.attention.re_attention import (
    attention_output_variance,
    dense_output_variance,
    effective_errors,
    layer_norm_output_variance,
    product_variance,
    re_attention_correction,
    relu_moments,
)

__all__ = [
    "CausalSelfAttention",
    "ItemFrequencies",
    "ItemFrequencyFileError",
    "attention_output_variance",
    "dense_output_variance",
    "effective_errors",
    "exact_item_frequencies",
    "layer_norm_output_variance",
    "private_item_frequencies",
    "product_variance",
    "public_item_frequencies",
    "read_item_frequencies",
    "re_attention_correction",
    "relu_moments",
]
