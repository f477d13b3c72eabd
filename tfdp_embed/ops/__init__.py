"""Custom TensorFlow ops (C++, compiled on first use; see README.md here).

`fast_normal.normal(generator, shape, stddev)`: exact Gaussian noise ~10x
faster than `tf.random.Generator.normal` on CPU, with a fallback to it.
"""
