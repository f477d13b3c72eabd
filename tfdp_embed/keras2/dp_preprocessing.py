"""Keras preprocessing layers whose state is released with DP (or public), accepted by `DPModel`.

* `lookup_layer(vocabulary)`: a `StringLookup` / `IntegerLookup` over a
  `DPVocabulary` (`tfdp_embed.data.vocabulary.dp_vocabulary`, or a public
  catalogue); keys not selected map to the out-of-vocabulary index.
* `normalization_layer(stats)`: a `Normalization` layer from the DP mean and
  variance of `tfdp_embed.data.normalization.dp_normalization_statistics`
  (re-exported here).

The layers are marked with where their state came from, so that `DPModel`
accepts them; the releases themselves (`.release`) go to the run's plan and ledger.

Example:
    >>> stats = dp_normalization_statistics(ages, epsilon=0.5, delta=1e-6, clip_range=(0, 100))
    >>> layer = normalization_layer(stats)
"""

from __future__ import annotations

from tfdp_embed.data.normalization import NormalizationStatistics, dp_normalization_statistics
from tfdp_embed.data.vocabulary import DPVocabulary
from tfdp_embed.keras2._keras import keras
from tfdp_embed.keras2.contract.preprocessing import mark_state_source


def lookup_layer(vocabulary: DPVocabulary, *, strings: bool | None = None, **kwargs) -> keras.layers.Layer:
    """A `StringLookup` (string keys) or `IntegerLookup` over the released keys, marked for `DPModel`.

    Raises:
      TypeError: `vocabulary` is not a `DPVocabulary`.
      ValueError: an empty vocabulary (no key passed the threshold: a larger epsilon or more data).
    """
    if not isinstance(vocabulary, DPVocabulary):
        raise TypeError(f"`vocabulary` must be a DPVocabulary; received {type(vocabulary).__name__}.")
    if vocabulary.keys.size == 0:
        raise ValueError(
            f"The vocabulary {vocabulary.name!r} is empty: no key passed the DP threshold. Allowed: a larger "
            "epsilon, a smaller `max_keys_per_unit`, or a public catalogue."
        )
    strings = vocabulary.keys.dtype.kind in "US" if strings is None else strings
    keys = [str(k) for k in vocabulary.keys] if strings else [int(k) for k in vocabulary.keys]
    layer = (keras.layers.StringLookup if strings else keras.layers.IntegerLookup)(vocabulary=keys, **kwargs)
    source = "public" if vocabulary.is_public else f"dp: {vocabulary.name} (epsilon {vocabulary.epsilon:.4g})"
    return mark_state_source(layer, source)


def normalization_layer(stats: NormalizationStatistics, **kwargs) -> keras.layers.Layer:
    """`keras.layers.Normalization(mean=, variance=)` from DP statistics, marked for `DPModel`."""
    if not isinstance(stats, NormalizationStatistics):
        raise TypeError(f"`stats` must be NormalizationStatistics; received {type(stats).__name__}.")
    layer = keras.layers.Normalization(mean=stats.mean, variance=stats.variance, **kwargs)
    return mark_state_source(layer, f"dp: {stats.name} (epsilon {stats.epsilon:.4g})")


__all__ = ["NormalizationStatistics", "dp_normalization_statistics", "lookup_layer", "normalization_layer"]
