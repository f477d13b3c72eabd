"""The coverage check: the clipping rules must account for the whole gradient.

Each registry rule describes how its layer uses its weights (a Dense
matmul, a table lookup). A layer that also uses them another way (a
`DPEmbedding` subclass that reads `self.embeddings` with `tf.gather`
itself, a parent model multiplying by a layer's kernel) gets norms and a
clipped sum that miss that use. With every clip factor 1 the rules' clipped
sums are sum_i g_i, which must equal the gradient of sum_i loss_i; on one
batch, before training, every trainable variable is compared, and a
mismatch names the layer that owns the variable.
"""

from __future__ import annotations

from collections.abc import Callable

from tfdp_embed._keras import tf
from tfdp_embed.clipping.per_example import layer_gradients
from tfdp_embed.clipping.taps import own_trainable_variables, record_taps
from tfdp_embed.errors import PrivacyContractError

RTOL = 1e-4  # of the variable's largest gradient entry: float32 round-off passes, a missed use does not
ATOL = 1e-6  # of the model's largest gradient entry: for gradients that cancel to ~0 (a key's bias)
# Of sum_i ||g_i|| over the owning layer's weights: the round-off of per-example gradients that cancel
# (a candidate tower's output bias under a full softmax: each example's gradient is a sum over the K
# candidates that is exactly 0, computed as ~0 ± float32 round-off growing with K), where both scales
# above are ~0. The tolerance is the larger of NORM_SUM_RTOL and float32 epsilon x K.
NORM_SUM_RTOL = 1e-5
FLOAT32_EPS = 2.0**-23


def check_rules_cover_gradients(model, layers: list, *, registry, fallback, forward: Callable[[], tf.Tensor]) -> None:
    """Refuses the model if some variable's rule-built gradient sum differs from its true gradient.

    Args:
      model: the model being trained.
      layers: its layers owning trainable weights (the tapped layers).
      registry: the `LayerRegistry` DPModel uses.
      fallback: the per-example fallback DPModel uses.
      forward: runs one forward pass and returns the per-example losses `[n]`.

    Raises:
      PrivacyContractError: naming the layer whose weights the rules miss.
    """
    with tf.GradientTape(persistent=True) as tape, record_taps(layers, registry) as taps:
        loss = forward()
    infos = layer_gradients(taps, loss, tape, registry, fallback)
    variables = model.trainable_variables
    true = tape.gradient(loss, variables, output_gradients=tf.ones_like(loss))
    del tape
    ones = tf.ones_like(loss)
    built, round_offs = {}, {}
    for tap, info in infos:
        round_off = _round_off_rtol(tap) * float(tf.reduce_sum(tf.sqrt(tf.cast(info.squared_norms, tf.float64))))
        for variable, grad in zip(info.variables, info.clipped_sum(ones)):
            built[variable.ref()] = grad
            round_offs[variable.ref()] = round_off
    compared = [(v, _difference(built.get(v.ref()), expected)) for v, expected in zip(variables, true)]
    largest = max((scale for _, (_, scale) in compared), default=0.0)
    for variable, (difference, scale) in compared:
        if difference > RTOL * scale + ATOL * largest + round_offs.get(variable.ref(), 0.0):
            owner = next((layer for layer in layers if _owns(layer, variable)), None)
            raise PrivacyContractError(_message(owner, variable, difference, scale))


def _round_off_rtol(tap) -> float:
    """NORM_SUM_RTOL, or float32 epsilon x the most candidates a shared call of the layer ran over."""
    candidates = [c.outputs.shape[0] for c in tap.calls if c.shared is not None and c.outputs.shape.rank]
    return max([NORM_SUM_RTOL] + [FLOAT32_EPS * int(n) for n in candidates if n is not None])


def _owns(layer, variable) -> bool:
    return any(v is variable for v in own_trainable_variables(layer))


def _rows(grad):
    """(int64 row ids, rows as float64 `[n, -1]`) of a gradient (IndexedSlices or dense)."""
    if isinstance(grad, tf.IndexedSlices):
        indices, values = tf.cast(grad.indices, tf.int64), grad.values
    else:
        values = tf.convert_to_tensor(grad)
        values = tf.reshape(values, [1]) if values.shape.rank == 0 else values
        indices = tf.range(tf.shape(values, out_type=tf.int64)[0])
    return indices, tf.reshape(tf.cast(values, tf.float64), [tf.shape(indices)[0], -1])


def _largest_row_sum(indices, values) -> float:
    """max |entry| of the rows summed by index (repeated indices add up)."""
    unique, index = tf.unique(indices)
    summed = tf.math.unsorted_segment_sum(values, index, tf.size(unique))
    return float(tf.reduce_max(tf.abs(summed))) if int(tf.size(summed)) else 0.0


def _difference(got, expected) -> tuple:
    """(max |got - expected|, max |expected| or |got|) over the variable's entries; None is zero."""
    parts = [(_rows(g), sign) for g, sign in ((got, 1.0), (expected, -1.0)) if g is not None]
    if not parts:
        return 0.0, 0.0
    scale = max(_largest_row_sum(*rows) for rows, _ in parts)
    indices = tf.concat([rows[0] for rows, _ in parts], 0)
    values = tf.concat([sign * rows[1] for rows, sign in parts], 0)
    return _largest_row_sum(indices, values), scale


def _message(layer, variable, difference: float, scale: float) -> str:
    where = f"layer {layer.name!r} ({type(layer).__name__})" if layer is not None else "no layer"
    return (
        f"The per-example clipping rules miss part of the gradient of {variable.name!r}, owned by "
        f"{where}: the sum of the per-example gradients they build differs from the gradient of "
        f"the summed loss by {difference:.3g} (largest entry {scale:.3g}). The weights are used "
        "in a way the layer's rule does not record (e.g. a DPEmbedding subclass reading "
        "`self.embeddings` itself instead of through `self.lookup(ids)`, or another layer or "
        "model using the variable directly), so per-example norms and the applied gradient would "
        "be wrong. Read the weights only through the layer (`lookup` for tables), or register a "
        "rule for that layer in the LayerRegistry."
    )
