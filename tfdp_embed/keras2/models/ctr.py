"""The pCTR model of DP-FEST App. D.1, with a DCN-v2 option, from public tfdp_embed layers.

    x = concat([E_1[C1], ..., E_26[C26], log-integers I1..I13, missing flags])
    mlp: logit = W_out relu(W_4 ... relu(W_1 x))              (4 x 598 in the paper)
    dcn: x_{l+1} = x_0 * (W_l x_l + b_l) + x_l  (L cross layers, DCN-v2),
         then the same ReLU tower and W_out

One table per categorical feature `Ck`, with `V_k + 1` rows (row 0 =
missing, as `tfdp_embed.data.criteo` hashes) and `int(2 * V_k ** 0.25)`
columns; by default the tables of one width share one variable, a
`StackedEmbedding` per width group (`stack_tables`; `table_layout` lists
them, `feature_table` gives a feature's layer and row offset), otherwise
one `DPEmbedding` per feature. The inputs are the features `tfdp_embed.data.criteo.parse_raw_fields`
produces: `I1..I13` float32 `[batch]` (sign(x) log(1 + |x|)), `int_missing`
float32 `[batch, 13]`, `C1..C26` int64 `[batch]` bucket ids. The model
returns one click *logit* per example, `[batch, 1]`: train it with
`BinaryCrossentropy(from_logits=True)`; the serving module
(`tfdp_embed.keras2.models.ctr_serving`) applies the sigmoid.

Every layer with weights is a `DPEmbedding` or a `keras.layers.Dense` (the
DCN-v2 `tfrs.layers.dcn.Cross` layers hold Dense sub-layers), so the default
clipping registry computes exact per-example norms without per-example
gradients, and every mechanism sees the tables (or stacks) as sparse variables.

Example:
    >>> config = CTRModelConfig.from_vocab_sizes(hash_size=1000, hidden_units=(64, 64))
    >>> model = build_ctr_model(config)
    >>> logits = model(parse_raw_fields(ints, cats, hash_size=1000))   # [batch, 1]

References: Ghazi et al., "Sparsity-Preserving Differentially Private
Training of Large Embedding Models" (DP-FEST), NeurIPS 2023, App. D.1 and
Table 3; Wang et al., "DCN V2", WWW 2021, Eq. (1) (`tfrs.layers.dcn.Cross`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from tfdp_embed.data.criteo import (
    CAT_FEATURES,
    INT_FEATURES,
    INT_MISSING,
    embedding_dim,
    resolve_vocab_sizes,
)
from tfdp_embed.keras2 import DPEmbedding, keras, tf
from tfdp_embed.keras2.layers.stacked_embedding import StackedEmbedding, stacked_tables
from tfdp_embed.layers.stacked_lookup import stack_name, width_groups

ARCHITECTURES = ("mlp", "dcn")
PAPER_HIDDEN_UNITS = (598, 598, 598, 598)


def ctr_embedding_dims(vocab_sizes: Sequence[int]) -> tuple[int, ...]:
    """Embedding widths `int(2 * V ** 0.25)` for vocabularies `V` (DP-FEST App. D.1).

    Example:
        >>> ctr_embedding_dims([82741, 3])
        (33, 2)
    """
    return tuple(embedding_dim(int(v)) for v in vocab_sizes)


def _positive_ints(name: str, values, *, length: int | None = None, allow_empty: bool = False) -> tuple:
    values = tuple(values)
    if length is not None and len(values) != length:
        raise ValueError(f"`{name}` must have {length} entries; received {len(values)}: {values!r}.")
    if not values and not allow_empty:
        raise ValueError(f"`{name}` must not be empty.")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"`{name}` must hold positive ints; received {values!r}.")
    return values


@dataclasses.dataclass(frozen=True)
class CTRModelConfig:
    """Static description of a pCTR model (no tensors; JSON-able via `get_config`).

    Attributes:
      vocab_sizes: 26 hash vocabulary sizes `V_k`, in `C1..C26` order (the
        tables have `V_k + 1` rows). Must equal what the reader hashed with.
      hidden_units: widths of the ReLU tower; the paper uses 4 x 598.
      architecture: "mlp" (DP-FEST App. D.1) or "dcn" (DCN-v2 cross layers
        before the tower).
      num_cross_layers: DCN-v2 cross layers (architecture "dcn" only).
      cross_projection_dim: low-rank size of each cross layer's matrix
        (None: full rank), DCN-v2 §3.
      embedding_dims: per-feature widths overriding `int(2 * V ** 0.25)`
        (tests use tiny ones); None for the paper's rule.
      use_missing_indicators: also feed the 13 integer missing flags.
      stack_tables: keep the tables of one width in one `StackedEmbedding`
        per width group (`embedding_stack_{width}`), so each step does one
        lookup, catch-up, noise and scatter per group; False: one
        `DPEmbedding` per feature (`embedding_C1` .. `embedding_C26`).
    """

    vocab_sizes: tuple
    hidden_units: tuple = PAPER_HIDDEN_UNITS
    architecture: str = "mlp"
    num_cross_layers: int = 3
    cross_projection_dim: int | None = None
    embedding_dims: tuple | None = None
    use_missing_indicators: bool = True
    stack_tables: bool = True

    def __post_init__(self):
        object.__setattr__(
            self, "vocab_sizes", _positive_ints("vocab_sizes", self.vocab_sizes, length=len(CAT_FEATURES))
        )
        object.__setattr__(self, "hidden_units", _positive_ints("hidden_units", self.hidden_units, allow_empty=True))
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"`architecture` must be one of {ARCHITECTURES}; received {self.architecture!r}.")
        if (
            isinstance(self.num_cross_layers, bool)
            or not isinstance(self.num_cross_layers, int)
            or (self.num_cross_layers < (1 if self.architecture == "dcn" else 0))
        ):
            raise ValueError(
                "`num_cross_layers` must be an int >= 1 for architecture 'dcn' (>= 0 otherwise); "
                f"received {self.num_cross_layers!r}."
            )
        if self.cross_projection_dim is not None:
            _positive_ints("cross_projection_dim", [self.cross_projection_dim])
        if self.embedding_dims is not None:
            object.__setattr__(
                self,
                "embedding_dims",
                _positive_ints("embedding_dims", self.embedding_dims, length=len(CAT_FEATURES)),
            )
        if not isinstance(self.stack_tables, bool):
            raise ValueError(f"`stack_tables` must be a bool; received {self.stack_tables!r}.")
        if not self.hidden_units and self.architecture == "mlp":
            raise ValueError("`hidden_units` must not be empty for architecture 'mlp'.")

    @classmethod
    def from_vocab_sizes(
        cls,
        vocab_sizes: Mapping[str, int] | Sequence[int] | None = None,
        *,
        hash_size: int | None = None,
        **kwargs,
    ) -> CTRModelConfig:
        """Config for the reader's vocabulary (`resolve_vocab_sizes` arguments) plus `kwargs`."""
        sizes = resolve_vocab_sizes(vocab_sizes, hash_size)
        return cls(vocab_sizes=tuple(sizes[name] for name in CAT_FEATURES), **kwargs)

    @property
    def vocab_by_feature(self) -> dict[str, int]:
        """`{"C1": V_1, ...}`: what `parse_raw_fields(vocab_sizes=...)` takes."""
        return dict(zip(CAT_FEATURES, self.vocab_sizes))

    @property
    def dims(self) -> tuple[int, ...]:
        """The embedding width of each feature."""
        return self.embedding_dims or ctr_embedding_dims(self.vocab_sizes)

    def get_config(self) -> dict:
        """A JSON-able dict; `from_config` inverts it."""
        config = dataclasses.asdict(self)
        for key, value in config.items():
            if isinstance(value, tuple):
                config[key] = list(value)
        return config

    @classmethod
    def from_config(cls, config: Mapping) -> CTRModelConfig:
        """Inverts `get_config`; a config saved before `stack_tables` existed describes unstacked tables."""
        fields: dict = {"stack_tables": False} | dict(config)
        return cls(**fields)


def _feature_inputs() -> dict:
    inputs = {name: keras.Input((), dtype=tf.float32, name=name) for name in INT_FEATURES}
    inputs[INT_MISSING] = keras.Input((len(INT_FEATURES),), dtype=tf.float32, name=INT_MISSING)
    inputs.update({name: keras.Input((), dtype=tf.int64, name=name) for name in CAT_FEATURES})
    return inputs


def build_ctr_model(config: CTRModelConfig, *, name: str = "pctr") -> keras.Model:
    """Builds the functional pCTR model: feature dict in, click logit `[batch, 1]` out.

    Args:
      config: a `CTRModelConfig`.
      name: Keras model name.

    Returns:
      A built `keras.Model`. With `config.stack_tables` its tables are one
      `StackedEmbedding` per width group (`table_names(config)`); without,
      one `DPEmbedding` per feature, `embedding_C1` .. `embedding_C26`.
      DP-FEST selections and LazyDP lookaheads key on these layer names
      (`table_counts`, `table_ids_fn` map per-feature data onto them).

    Raises:
      TypeError: `config` is not a `CTRModelConfig`.
      ImportError: architecture "dcn" without tensorflow-recommenders.

    References: DP-FEST App. D.1; DCN-v2 Eq. (1).
    """
    if not isinstance(config, CTRModelConfig):
        raise TypeError(f"`config` must be a CTRModelConfig; received {type(config).__name__}.")
    inputs = _feature_inputs()
    looked_up = {}
    for layer, features in _tables(config):
        if isinstance(layer, StackedEmbedding):
            looked_up.update(layer({f: inputs[f] for f in features}))
        else:
            looked_up[features[0]] = layer(inputs[features[0]])
    parts = [looked_up[feature] for feature in CAT_FEATURES]  # C1..C26 order in either layout
    ints = keras.layers.Lambda(lambda xs: tf.stack(xs, axis=-1), name="log_integers")(
        [inputs[name] for name in INT_FEATURES]
    )
    parts.append(ints)
    if config.use_missing_indicators:
        parts.append(inputs[INT_MISSING])
    x = keras.layers.Concatenate(name="features")(parts)
    if config.architecture == "dcn":
        import tensorflow_recommenders as tfrs

        x0 = x
        for i in range(config.num_cross_layers):
            x = tfrs.layers.dcn.Cross(projection_dim=config.cross_projection_dim, name=f"cross_{i}")(x0, x)
    for i, units in enumerate(config.hidden_units):
        x = keras.layers.Dense(units, activation="relu", name=f"hidden_{i}")(x)
    logit = keras.layers.Dense(1, name="click_logit")(x)
    return keras.Model(inputs, logit, name=name)


def _tables(config: CTRModelConfig) -> list[tuple]:
    """`[(table layer, its features)]`: one `StackedEmbedding` per width group, or one `DPEmbedding` per feature."""
    if config.stack_tables:
        tables = {f: (v + 1, d) for f, v, d in zip(CAT_FEATURES, config.vocab_sizes, config.dims)}
        return [(layer, layer.features) for layer in stacked_tables(tables)]
    return [
        (DPEmbedding(vocab + 1, dim, name=f"embedding_{feature}"), (feature,))
        for feature, vocab, dim in zip(CAT_FEATURES, config.vocab_sizes, config.dims)
    ]


def table_layout(config: CTRModelConfig | None = None) -> dict[str, tuple]:
    """`{table layer name: its features, in row order}` of `build_ctr_model(config)`.

    None: the unstacked layout, `{"embedding_C1": ("C1",), ...}`.
    """
    if config is None or not config.stack_tables:
        return {f"embedding_{feature}": (feature,) for feature in CAT_FEATURES}
    groups = width_groups({f: (v + 1, d) for f, v, d in zip(CAT_FEATURES, config.vocab_sizes, config.dims)})
    return {stack_name(width, dtype): tuple(features) for (width, dtype), features in groups}  # no layer built


def table_names(config: CTRModelConfig | None = None) -> list[str]:
    """The table layer names `build_ctr_model(config)` uses (None: the per-feature names, C1..C26 order)."""
    return list(table_layout(config))


def feature_table(config: CTRModelConfig, feature: str) -> tuple[str, int]:
    """`(table layer name, row offset)`: feature row r lives in that layer's row offset + r."""
    if feature not in CAT_FEATURES:
        raise ValueError(f"`feature` must be one of C1..C26; received {feature!r}.")
    return _feature_tables(config)[feature]


def _feature_tables(config: CTRModelConfig) -> dict[str, tuple[str, int]]:
    """`{feature: (table layer name, row offset)}` for every feature."""
    sizes, out = dict(zip(CAT_FEATURES, config.vocab_sizes)), {}
    for name, features in table_layout(config).items():
        offset = 0
        for feature in features:
            out[feature] = (name, offset)
            offset += sizes[feature] + 1
    return out


def table_counts(config: CTRModelConfig, counts: Mapping[str, np.ndarray]) -> dict:
    """`{table layer name: bucket counts}` from `{feature: counts [V_f + 1]}` (a stack's are concatenated)."""
    return {
        name: np.concatenate([np.asarray(counts[f]) for f in features])
        for name, features in table_layout(config).items()
    }


def table_ids_fn(config: CTRModelConfig):
    """`features -> {table layer name: bucket ids}`, what LazyDP's lookahead (`with_lookahead`) takes.

    A stack's ids are its features' ids plus their row offsets, `[batch, F]`.
    """
    layout = table_layout(config)
    if not config.stack_tables:
        return lambda features: {name: features[group[0]] for name, group in layout.items()}
    offsets = {f: offset for f, (_, offset) in _feature_tables(config).items()}

    def stacked_ids(features) -> dict:
        return {
            name: tf.stack([tf.cast(features[f], tf.int64) + offsets[f] for f in group], axis=1)
            for name, group in layout.items()
        }

    return stacked_ids


__all__ = [
    "ARCHITECTURES",
    "PAPER_HIDDEN_UNITS",
    "CTRModelConfig",
    "build_ctr_model",
    "ctr_embedding_dims",
    "feature_table",
    "table_counts",
    "table_ids_fn",
    "table_layout",
    "table_names",
]
