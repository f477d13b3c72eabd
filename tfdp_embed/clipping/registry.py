"""The registry of per-example gradient-norm functions, matched with `isinstance`.

A registry function receives one layer's recorded calls and the gradient of
the summed per-example loss with respect to each call's outputs, and
returns a `LayerGradients`: exact per-example squared gradient norms over
the layer's own trainable weights, and a function that builds the clipped
sum of per-example gradients, sum_i c_i * grad_i, from clip factors c
("book-keeping", Bu et al. 2022: no second backward pass).

Each entry names the method whose inputs and outputs its math describes
(`tapped_method`: `record_taps` records that method, e.g. `DPEmbedding.lookup`
rather than `call`), and the methods it assumes unchanged (`described`).
Registries are passed explicitly; lookup walks the entries in order and
takes the first whose class the layer is an instance of, so a user's
subclass of `DPEmbedding` is handled like the base class, as long as it
does not override a described method: the rule would then describe math
the subclass no longer computes. Such a layer either gets the exact
per-example fallback (`if_overridden="fallback"`: it re-runs whatever the
subclass's `call` computes) or is refused (`"refuse"`, for sparse tables,
whose fallback would build `[batch, vocab, dim]`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import tensorflow as tf

from tfdp_embed.errors import PrivacyContractError

_IF_OVERRIDDEN = ("fallback", "refuse")


@dataclasses.dataclass
class LayerGradients:
    """Per-example gradient information of one layer.

    Attributes:
      variables: the layer's own trainable variables, in the order that
        `clipped_sum` returns gradients for them.
      squared_norms: float32 `[batch]`, sum over `variables` of
        ||d loss_i / d v||^2 for each example i.
      clipped_sum: maps clip factors `[batch]` to a list of gradients,
        sum_i c_i * d loss_i / d v for each v: a dense tensor, or for
        embedding tables a `tf.IndexedSlices` with unique row indices.
      occurrences: embedding layers: one `EmbeddingOccurrences` per
        per-example call (the batch's own lookups).
      shared_rows: embedding layers: int64 rows read by data-independent
        computations this step (a candidate tower over the catalogue, a
        full-softmax scoring), which every example's gradient touches; None
        when there are none.
      rows_from_lookups: True when the rows of `clipped_sum`'s
        `IndexedSlices` are exactly the rows `occurrences` read plus
        `shared_rows` (an example's gradient touches the rows it looks up and
        no other): the rows only absent, weight-0 examples read can then be
        dropped (`tfdp_embed.absent_examples`). False (the default)
        keeps every row.
    """

    variables: list
    squared_norms: tf.Tensor
    clipped_sum: Callable[[tf.Tensor], list]
    occurrences: list | None = None
    shared_rows: tf.Tensor | None = None
    rows_from_lookups: bool = False


RegistryFunction = Callable  # (layer, taps: LayerTaps, output_grads: list[Tensor]) -> LayerGradients


@dataclasses.dataclass(frozen=True)
class RegistryEntry:
    """One rule: the layers it covers, the method it reads, and what overriding it means.

    Attributes:
      layer_class: the rule covers instances of this class and its subclasses.
      fn: the registry function.
      tapped_method: the method whose recorded inputs and outputs `fn` reads.
      described: further methods whose math `fn` assumes (besides `tapped_method`).
      if_overridden: "fallback" (per-example re-run of `call`) or "refuse"
        (`PrivacyContractError`) for a subclass overriding a described method.
    """

    layer_class: type
    fn: RegistryFunction
    tapped_method: str = "call"
    described: tuple = ()
    if_overridden: str = "fallback"

    def overridden_by(self, layer) -> list:
        """The described methods that `type(layer)` defines differently from `layer_class`."""
        names = (self.tapped_method, *self.described)
        return [n for n in names if getattr(type(layer), n, None) is not getattr(self.layer_class, n, None)]


class LayerRegistry:
    """An ordered mapping from layer classes to registry functions."""

    def __init__(self, entries: Sequence = ()):
        self._entries: list[RegistryEntry] = []
        for entry in entries:
            if isinstance(entry, RegistryEntry):
                self.register(
                    entry.layer_class,
                    entry.fn,
                    tapped_method=entry.tapped_method,
                    described=entry.described,
                    if_overridden=entry.if_overridden,
                )
            else:
                layer_class, fn = entry
                self.register(layer_class, fn)

    def register(
        self,
        layer_class: type,
        fn: RegistryFunction,
        *,
        tapped_method: str = "call",
        described: Sequence[str] = (),
        if_overridden: str = "fallback",
    ) -> None:
        """Adds an entry; later entries for subclasses should come first to win."""
        if not isinstance(layer_class, type):
            raise TypeError(f"`layer_class` must be a class; received {layer_class!r}.")
        if not callable(fn):
            raise TypeError(f"`fn` must be callable; received {fn!r}.")
        for name in (tapped_method, *described):
            if not callable(getattr(layer_class, name, None)):
                raise ValueError(
                    f"`tapped_method`/`described` must name methods of {layer_class.__name__}; received {name!r}."
                )
        if if_overridden not in _IF_OVERRIDDEN:
            raise ValueError(f"`if_overridden` must be one of {_IF_OVERRIDDEN}; received {if_overridden!r}.")
        self._entries.append(RegistryEntry(layer_class, fn, tapped_method, tuple(described), if_overridden))

    @tf.autograph.experimental.do_not_convert
    def entry(self, layer) -> RegistryEntry | None:
        """The first entry whose class `layer` is an instance of (overridden or not)."""
        for entry in self._entries:
            if isinstance(layer, entry.layer_class):
                return entry
        return None

    @tf.autograph.experimental.do_not_convert
    def lookup(self, layer) -> RegistryFunction | None:
        """The function for `layer`; None when the exact fallback must handle it.

        Raises:
          PrivacyContractError: `layer` overrides a method its rule describes and
            the rule refuses overrides.
        """
        entry = self.entry(layer)
        if entry is None:
            return None
        overridden = entry.overridden_by(layer)
        if not overridden:
            return entry.fn
        if entry.if_overridden == "fallback":
            return None
        raise PrivacyContractError(_refusal(layer, entry, overridden))

    @tf.autograph.experimental.do_not_convert
    def tapped_method(self, layer) -> str:
        """The method `record_taps` records for `layer`: its rule's, or `call` for the fallback."""
        entry = self.entry(layer)
        if entry is None or entry.overridden_by(layer):
            return "call"
        return entry.tapped_method

    def copy(self) -> LayerRegistry:
        return LayerRegistry(self._entries)

    def __iter__(self):
        return iter(self._entries)


def _refusal(layer, entry: RegistryEntry, overridden: list) -> str:
    base = entry.layer_class.__name__
    hint = (
        "override `call` instead (transform what `self.lookup(ids)` returns there)"
        if entry.tapped_method != "call"
        else "leave them as they are and put extra computation in a separate layer"
    )
    return (
        f"Layer {layer.name!r} ({type(layer).__name__}) overrides {', '.join(f'`{m}`' for m in overridden)} "
        f"of {base}, whose per-example clipping rule assumes {base}'s own math there: its "
        f"per-example gradient norms would be wrong, and a per-example re-run would build a "
        f"[batch, vocabulary, dim] gradient. To subclass {base}, {hint}; or register a rule "
        f"for {type(layer).__name__} in the LayerRegistry."
    )


__all__ = ["LayerGradients", "LayerRegistry", "RegistryEntry", "RegistryFunction"]
