"""Custom TensorFlow ops (C++, compiled on first use; see README.md here).

`fast_normal.normal(generator, shape, stddev)`: exact Gaussian noise, faster
than `tf.random.Generator.normal` on CPU, with a fallback to it.
`sparse_rows`: fused sparse-row ops of the DP step, each bit-identical to
its TensorFlow reference.
"""

__all__ = ["build", "fast_normal", "placement", "sparse_rows"]
