"""Preprocessing layers that hold statistics of data (vocabularies, means, bins) in a DP model.

A `StringLookup`/`IntegerLookup`/`TextVectorization` vocabulary, a
`Normalization` mean and variance or `Discretization` bins adapted on the
training rows (the standard TFRS recipe: `StringLookup(vocabulary=unique
user ids)`) ship in the exported model unnoised: a new user's id appears in
the vocabulary, a target's feature value is recovered from the mean. DP-SGD
protects only the trained weights, so `DPModel.prepare` refuses every Keras
preprocessing layer (`keras.layers.experimental.preprocessing.PreprocessingLayer`)
unless its state was

* released with DP: `tfdp_embed.keras2.dp_preprocessing.lookup_layer(dp_vocabulary(...))`,
  `normalization_layer(dp_normalization_statistics(...))` mark the layers they build; or
* taken from a public source independent of the training data, declared with
  `declare_public(layer, source="...")` (the guarantee then rests on that).

`Hashing` and `CategoryEncoding` hold no data and are always accepted.

Example:
    >>> lookup = keras.layers.StringLookup(vocabulary=public_catalogue_ids)
    >>> declare_public(lookup, source="the shop's public product catalogue")
"""

from __future__ import annotations

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras

_MARK = "_tfdp_embed_state_source"
_PREPROCESSING = keras.layers.experimental.preprocessing.PreprocessingLayer


def declare_public(layer: keras.layers.Layer, *, source: str) -> keras.layers.Layer:
    """Declares `layer`'s state (vocabulary, mean, bins) taken from a public source; returns the layer.

    Raises:
      TypeError: `layer` is not a Keras preprocessing layer.
      ValueError: `source` is empty (say where the state came from: it goes into the guarantee's conditions).
    """
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"`source` must say where the layer's state came from; received {source!r}.")
    return mark_state_source(layer, f"public: {source.strip()}")


def mark_state_source(layer: keras.layers.Layer, source: str) -> keras.layers.Layer:
    """Records where `layer`'s state came from ("public: ..." or "dp: ..."); the DP builders call it."""
    if not isinstance(layer, _PREPROCESSING):
        raise TypeError(f"`layer` must be a Keras preprocessing layer; received {type(layer).__name__}.")
    object.__setattr__(layer, _MARK, source)  # not tracked: nothing is saved with the model
    return layer


def state_source(layer: keras.layers.Layer) -> str | None:
    """Where a preprocessing layer's state came from, or None when nobody said."""
    return getattr(layer, _MARK, None)


def preprocessing_sources(model: keras.Model) -> dict:
    """`{layer name: source}` of the model's preprocessing layers (for reports)."""
    return {layer.name: state_source(layer) for layer in _preprocessing_layers(model)}


def check_preprocessing(model: keras.Model) -> None:
    """Raises PrivacyContractError for a preprocessing layer whose state is neither DP-released nor public.

    Raises:
      PrivacyContractError: names the layers and the DP alternatives.
    """
    undeclared = [layer for layer in _preprocessing_layers(model) if state_source(layer) is None]
    if not undeclared:
        return
    names = ", ".join(f"{layer.name!r} ({type(layer).__name__})" for layer in undeclared)
    raise PrivacyContractError(
        f"Model {model.name!r} holds preprocessing layers with state computed from data: {names}. Their "
        "vocabulary / mean / variance / bins are exported as they are, outside DP-SGD's noise: built from the "
        "training rows they reveal which ids occur and the rows' exact statistics. Allowed: state released with "
        "DP (`tfdp_embed.keras2.dp_preprocessing.lookup_layer(dp_vocabulary(...))`, "
        "`normalization_layer(dp_normalization_statistics(...))`, charged to the budget), or state from a public "
        "source declared with `tfdp_embed.keras2.contract.preprocessing.declare_public(layer, source=...)`; `Hashing` "
        "needs neither."
    )


def _preprocessing_layers(model: keras.Model) -> list:
    layers = [model] + list(model.submodules)
    return [layer for layer in layers if isinstance(layer, _PREPROCESSING)]


__all__ = ["check_preprocessing", "declare_public", "mark_state_source", "preprocessing_sources", "state_source"]
