"""Serving a trained pCTR model on raw Criteo fields.

`CTRServingModule` holds the trained Keras model (its variables only: no
optimizer, no mechanism state) and one `tf.function`, `serve`, whose input
is the 39 raw Criteo feature fields of a batch of requests, by name:

* `I1` .. `I13`: tf.string `[batch]`, the integer fields exactly as they
  appear in the TSV or CSV (`"3"`, `"-1"`, `"260.0"`, `""` = missing),
  checked against the training reader's pattern (`rows.INT_FIELD_PATTERN`),
  so serving accepts what training accepts and reads the same value. Strings, not numbers,
  because that is the raw form, it can say "missing" without a sentinel,
  and int64 counts never lose precision in a float;
* `C1` .. `C26`: tf.string `[batch]`, the 8-hex-digit hashes (`""` = missing).

Inside, `tfdp_embed.data.criteo.parse_raw_fields` applies the training
transform (log integers, hash buckets with the training vocabulary), the
model gives a logit and the output is
`{"click_probability": sigmoid(logit) [batch], "logit": [batch]}`.

Malformed requests fail with messages that name the problem: a missing or
unknown field or a non-string field is rejected by the signature (TF names
the argument); an integer field that is not a number, or fields of
different lengths, fail inside with the field named.

Example:
    >>> module = CTRServingModule(dp_model.inner, config)
    >>> export_saved_model(dp_model, "out/saved_model", serving_module=module,
    ...                    signatures={"serving_default": module.serve})
    >>> serve = tf.saved_model.load("out/saved_model").signatures["serving_default"]
    >>> serve(I1=tf.constant(["3"]), ..., C26=tf.constant(["9727dd16"]))["click_probability"]

References: DP-FEST App. D.1 (features); LazyDP §3 (only the final,
flushed model is released).
"""

from __future__ import annotations

from collections.abc import Mapping

from tfdp_embed.data.criteo import CAT_FEATURES, INT_FEATURES, parse_raw_fields
from tfdp_embed.data.criteo.rows import INT_FIELD_PATTERN
from tfdp_embed.keras2 import keras, tf
from tfdp_embed.keras2.models.ctr import CTRModelConfig

RAW_FIELDS = INT_FEATURES + CAT_FEATURES


def serving_input_signature() -> dict:
    """`{field: tf.TensorSpec([None], tf.string)}` for the 13 + 26 raw Criteo fields."""
    return {name: tf.TensorSpec([None], tf.string, name=name) for name in RAW_FIELDS}


def _check_fields(fields: Mapping[str, tf.Tensor]) -> list:
    """Asserts: every integer field is '' or a number; every field has the batch's length."""
    checks = []
    size = tf.shape(fields[RAW_FIELDS[0]])[0]
    for name in RAW_FIELDS:
        value = fields[name]
        checks.append(
            tf.debugging.assert_equal(
                tf.shape(value)[0],
                size,
                message=f"Criteo serving input: field {name} has a different number of values "
                f"than field {RAW_FIELDS[0]}; every field needs one value per request.",
            )
        )
    for name in INT_FEATURES:
        value = fields[name]
        ok = tf.strings.regex_full_match(value, INT_FIELD_PATTERN)  # the training reader's rule (rows.py)
        checks.append(
            tf.debugging.Assert(
                tf.reduce_all(ok),
                [
                    f"Criteo serving input: integer field {name} must hold integers as strings, as "
                    "training reads them: '' (missing), 17, -2 or an integral float such as 260.0; offending values:",
                    tf.boolean_mask(value, tf.logical_not(ok))[:3],
                ],
            )
        )
    return checks


class CTRServingModule(tf.Module):
    """A SavedModel-ready module: raw Criteo fields in, click probability out.

    Args:
      model: the trained pCTR Keras model (`build_ctr_model`), e.g. `dp_model.inner`.
      config: its `CTRModelConfig` (the vocabulary the reader hashed with).

    Raises:
      TypeError: on a wrong `model` or `config` type.

    Note: trace `serve` only through `tfdp_embed.keras2.export.export_saved_model`
    (which removes training read hooks first); calling it in the training
    process before export would bake LazyDP's read hook into the trace.
    """

    def __init__(self, model: keras.Model, config: CTRModelConfig, *, name: str = "ctr_serving"):
        super().__init__(name=name)
        if not isinstance(model, keras.Model):
            raise TypeError(f"`model` must be a keras.Model; received {type(model).__name__}.")
        if not isinstance(config, CTRModelConfig):
            raise TypeError(f"`config` must be a CTRModelConfig; received {type(config).__name__}.")
        # Only the variables are tracked: the SavedModel then holds the weights
        # and the `serve` graph, not a Keras object graph (much faster to save
        # and load). A traced op that captured any other state (a mechanism's)
        # would make saving fail.
        self.model_variables = list(model.variables)
        object.__setattr__(self, "_model", model)
        self._vocab = config.vocab_by_feature
        self.serve = tf.function(self._serve, input_signature=[serving_input_signature()])

    def features(self, fields: Mapping[str, tf.Tensor]) -> dict:
        """The model's input features from raw fields (same transform as training)."""
        ints = tf.stack([fields[name] for name in INT_FEATURES], axis=-1)
        cats = tf.stack([fields[name] for name in CAT_FEATURES], axis=-1)
        return parse_raw_fields(ints, cats, vocab_sizes=self._vocab)

    def _serve(self, fields):
        with tf.control_dependencies(_check_fields(fields)):
            features = self.features({k: tf.identity(v) for k, v in fields.items()})
        logit = tf.reshape(self._model(features, training=False), [-1])
        return {"click_probability": tf.sigmoid(logit), "logit": logit}


def check_request(request: Mapping[str, object]) -> dict:
    """Validates a raw-field request for `serving_default` and converts it to tensors.

    Calling the signature directly also rejects bad input, but TensorFlow's
    message for a wrong dtype names an input position, not a field; this
    check names the field and what is allowed.

    Args:
      request: `{field: values}` for all 39 fields `I1..I13`, `C1..C26`; values
        are tf.string tensors or sequences/arrays of `str`/`bytes`, one per
        request row.

    Returns:
      `{field: tf.string [batch]}`, ready for `signature(**result)`.

    Raises:
      ValueError: a missing or unknown field, a field that is not 1-D, or
        fields of different lengths.
      TypeError: a field whose values are not strings.

    Example:
        >>> serve = tf.saved_model.load(path).signatures["serving_default"]
        >>> serve(**check_request({"I1": ["3"], ..., "C26": ["9727dd16"]}))
    """
    if not isinstance(request, Mapping):
        raise TypeError(f"A serving request must map field names to values; received {type(request).__name__}.")
    missing = [name for name in RAW_FIELDS if name not in request]
    unknown = sorted(set(request) - set(RAW_FIELDS))
    if missing or unknown:
        raise ValueError(
            f"Criteo serving request: missing fields {missing}, unknown fields {unknown}; it needs "
            "exactly I1..I13 and C1..C26."
        )
    out: dict[str, tf.Tensor] = {}
    lengths: dict[int, str] = {}  # length -> first field with it
    for name in RAW_FIELDS:
        value = out[name] = _request_field(name, request[name])
        lengths.setdefault(int(value.shape[0]), name)
    if len(lengths) > 1:
        raise ValueError(
            "Criteo serving request: fields have different lengths "
            f"{ {length: field for length, field in lengths.items()} } (length: first field with it)."
        )
    return out


def _request_field(name: str, value) -> tf.Tensor:
    """Field `name` of a request as a 1-D tf.string tensor; refused (naming the field) otherwise."""
    if not isinstance(value, tf.Tensor):
        try:
            value = tf.convert_to_tensor(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"Criteo serving request: field {name} cannot become a tensor: {exc}") from None
    if value.dtype != tf.string:
        kind = (
            "integer values as decimal strings ('' = missing)"
            if name in INT_FEATURES
            else "hash strings ('' = missing)"
        )
        raise TypeError(
            f"Criteo serving request: field {name} has dtype {value.dtype.name}; serving_default "
            f"takes tf.string for every field ({name}: {kind})."
        )
    if value.shape.rank != 1:
        raise ValueError(
            f"Criteo serving request: field {name} must be 1-D (one value per request row); "
            f"received shape {value.shape}."
        )
    return value


__all__ = ["RAW_FIELDS", "CTRServingModule", "check_request", "serving_input_signature"]
