"""Leaving training: flush owed noise, drop DP machinery, save for serving (both front ends).

`export_saved_model` is the one public way to release a model trained with
`DPModel`: it flushes the mechanism (LazyDP adds every row's owed noise),
refuses if any noise is still owed, saves the *wrapped* model only (no
optimizer, no mechanism state, no read hooks) as a SavedModel, and writes
the privacy report beside it (`privacy_report.json`).

Example:
    >>> export_saved_model(dp_model, "saved_models/ctr", report=report)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import tensorflow as tf

from tfdp_embed.accounting.search_runs import check_export as check_search_export
from tfdp_embed.clipping.taps import submodules
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.layers.lookup import EmbeddingLookup, read_hooks_removed
from tfdp_embed.nonfinite import check_released_weights

REPORT_FILENAME = "privacy_report.json"


def _without_read_hooks(model):
    """Temporarily removes DPEmbedding read hooks so no mechanism op is traced."""
    return read_hooks_removed([m for m in [model, *submodules(model)] if isinstance(m, EmbeddingLookup)])


def release_ready(dp_model) -> None:
    """Flushes `dp_model`'s mechanism; raises PrivacyContractError if noise is still owed.

    The one release check: `DPModel.flush` and `export_saved_model` run it.
    """
    mechanism = getattr(dp_model, "mechanism", None)
    if mechanism is None:
        raise TypeError(f"Expected a DPModel; received {type(dp_model).__name__}.")
    mechanism.flush()
    if mechanism.owes_noise():
        raise PrivacyContractError(
            f"Mechanism {mechanism.name!r} still owes noise to some embedding rows after flush(); "
            "releasing the weights now would leave those rows less noisy than DP-SGD requires."
        )


def export_saved_model(
    dp_model,
    path: str,
    *,
    signatures: Mapping[str, object] | None = None,
    serving_module: tf.Module | None = None,
    report: Mapping | None = None,
) -> str:
    """Flushes and saves `dp_model.inner` (or `serving_module`) as a SavedModel.

    Args:
      dp_model: a trained `DPModel`.
      path: output directory.
      signatures: optional serving signatures (e.g. a `tf.function` taking raw
        fields), passed to `tf.saved_model.save`.
      serving_module: optional `tf.Module` to save instead of the wrapped
        model (it must only reference the wrapped model's variables).
      report: the privacy report; written to `path/privacy_report.json`.

    Returns:
      `path`.

    Raises:
      PrivacyContractError: if the mechanism still owes noise after flushing, or the model came out of a
        private search (`select_privately`) and `report` is not the search's (`search_report`).
      ValueError: a weight of the model or of `serving_module` is NaN or Inf (the model diverged).
    """
    release_ready(dp_model)
    check_search_export(dp_model.mechanism, report)
    target = serving_module if serving_module is not None else dp_model.inner
    check_released_weights(dp_model.inner, target)  # nothing diverged leaves
    with _without_read_hooks(dp_model.inner):
        tf.saved_model.save(target, path, signatures=signatures)
    if report is not None:
        with open(os.path.join(path, REPORT_FILENAME), "w") as f:
            json.dump(dict(report), f, indent=2, sort_keys=True, default=str)
    return path


__all__ = ["REPORT_FILENAME", "export_saved_model", "release_ready"]
