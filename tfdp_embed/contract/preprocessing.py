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

from tfdp_embed.clipping import layer_kinds
from tfdp_embed.clipping.taps import submodules
from tfdp_embed.errors import PrivacyContractError

_MARK = "_tfdp_embed_state_source"
# Keras 3 has no public base class of the layers whose state comes from `adapt`; these are they.
_KERAS3_STATEFUL = ("Normalization", "StringLookup", "IntegerLookup", "Discretization", "TextVectorization")


def is_preprocessing_layer(layer) -> bool:
    """A preprocessing layer with state from data: tf-keras' `PreprocessingLayer`s, Keras 3's adaptable layers."""
    tf_keras_base = layer_kinds.experimental_preprocessing_base()
    if tf_keras_base is not None and isinstance(layer, tf_keras_base):
        return True
    return any(layer_kinds.is_instance(layer, name) for name in _KERAS3_STATEFUL)


def declare_public(layer, *, source: str):
    """Declares `layer`'s state (vocabulary, mean, bins) taken from a public source; returns the layer.

    Raises:
      TypeError: `layer` is not a Keras preprocessing layer.
      ValueError: `source` is empty (say where the state came from: it goes into the guarantee's conditions).
    """
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"`source` must say where the layer's state came from; received {source!r}.")
    return mark_state_source(layer, f"public: {source.strip()}")


def mark_state_source(layer, source: str):
    """Records where `layer`'s state came from ("public: ..." or "dp: ..."); the DP builders call it."""
    if not is_preprocessing_layer(layer):
        raise TypeError(f"`layer` must be a Keras preprocessing layer; received {type(layer).__name__}.")
    object.__setattr__(layer, _MARK, source)  # not tracked: nothing is saved with the model
    return layer


def state_source(layer) -> str | None:
    """Where a preprocessing layer's state came from, or None when nobody said."""
    return getattr(layer, _MARK, None)


def preprocessing_sources(model) -> dict:
    """`{layer name: source}` of the model's preprocessing layers (for reports)."""
    return {layer.name: state_source(layer) for layer in _preprocessing_layers(model)}


def check_preprocessing(model) -> None:
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
        "DP (`tfdp_embed.data.vocabulary.dp_vocabulary`, `dp_normalization_statistics`, charged to the budget; "
        "tf-keras: `tfdp_embed.keras2.dp_preprocessing.lookup_layer(...)` / `normalization_layer(...)` build the "
        "layers), or state from a public source declared with "
        "`tfdp_embed.contract.preprocessing.declare_public(layer, source=...)`; `Hashing` needs neither."
    )


def _preprocessing_layers(model) -> list:
    return [layer for layer in [model, *submodules(model)] if is_preprocessing_layer(layer)]


__all__ = ["check_preprocessing", "declare_public", "mark_state_source", "preprocessing_sources", "state_source"]
