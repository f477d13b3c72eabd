"""The small model the release-path attacks train: ids [B, 2] -> mean-pooled DPEmbedding -> Dense(1)."""

from __future__ import annotations


def embedding_dense_model(vocab: int, dim: int, *, table_seed: int, dense_seed: int, fe=None):
    """A table named "items" (uniform init in [-0.5, 0.5]) and a Dense layer named "out", seeded.

    `fe`: the front end (the `fe` fixture of tests/conftest.py); tf-keras when None.
    """
    if fe is None:
        from tfdp_embed.keras2._keras import keras
        from tfdp_embed.keras2.layers.embedding import DPEmbedding
    else:
        keras, DPEmbedding = fe.keras, fe.DPEmbedding
    ids = keras.Input((2,), dtype="int32")
    init = keras.initializers.RandomUniform(-0.5, 0.5, seed=table_seed)
    table = DPEmbedding(vocab, dim, combiner="mean", name="items", embeddings_initializer=init)
    out = keras.layers.Dense(1, name="out", kernel_initializer=keras.initializers.GlorotUniform(seed=dense_seed))
    return keras.Model(ids, out(table(ids)))
