"""How a `DPModel` leaves training: flushed, and as the wrapped model alone.

Every exit (weights, weights files, `save`, checkpoints) first adds the noise
the mechanism still owes (LazyDP) and then hands out the wrapped model's
weights only; serializing the wrapper itself is refused, since its config
and object graph would carry training-only state (metrics, optimizer).
"""

from __future__ import annotations

from typing import Any

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2.export import _without_read_hooks, release_ready


class ReleaseExits:
    """`DPModel`'s exits from training (a mixin placed before `keras.Model` in its bases)."""

    inner: Any  # the wrapped Keras model
    _prepared: bool  # the mechanism is initialised

    def flush(self) -> None:
        """Adds all noise the mechanism still owes (LazyDP); a no-op for others.

        Raises:
          PrivacyContractError: the mechanism still owes noise afterwards.
        """
        release_ready(self)

    def _flush_if_prepared(self) -> None:
        """`flush` once the mechanism is initialised (before, nothing can be owed)."""
        if self._prepared:
            self.flush()

    def get_weights(self):
        """The wrapped model's weights, flushed (mechanism, optimizer and metrics are not weights)."""
        self._flush_if_prepared()
        return super().get_weights()  # type: ignore[misc]

    def set_weights(self, weights):
        """Sets the wrapped model's weights; flushes first so LazyDP's history matches what is written."""
        self._flush_if_prepared()
        return super().set_weights(weights)  # type: ignore[misc]

    def save_weights(self, filepath, *args, **kwargs):
        """Flushes, then writes the wrapped model's weights file (`self.inner.save_weights`).

        The file holds model weights only; it loads into the bare wrapped
        model (`inner.load_weights`) as well as into this `DPModel`.
        """
        self._flush_if_prepared()
        return self.inner.save_weights(filepath, *args, **kwargs)

    def load_weights(self, filepath, *args, **kwargs):
        """Loads a weights file of the wrapped model; flushes first (LazyDP's history stays consistent)."""
        self._flush_if_prepared()
        return self.inner.load_weights(filepath, *args, **kwargs)

    def save(self, filepath, *args, **kwargs):
        """Flushes, then saves the wrapped model (`self.inner.save`): the released model only.

        No mechanism state, optimizer or read hook is saved. Use
        `tfdp_embed.keras2.export.export_saved_model` to also write the privacy
        report beside it.
        """
        self._flush_if_prepared()
        with _without_read_hooks(self.inner):
            return self.inner.save(filepath, *args, **kwargs)

    def get_config(self):
        """Refused: a `DPModel` is the training wrapper, never a model to serialize.

        Keras serializes a model's config before its state
        (`keras.models.save_model(dp, "x.keras")`, `to_json`); refusing here
        keeps the loss tracker's and compiled metrics' training statistics
        out of any file. `dp.save(path)` saves the wrapped model.
        """
        raise PrivacyContractError(
            "A DPModel is the training wrapper: serializing it would write its training metrics "
            "(non-DP statistics of the training data). Save the released model with "
            "dp_model.save(path) or tfdp_embed.keras2.export.export_saved_model(dp_model, path)."
        )

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        """TF's object graph of a `DPModel` is its wrapped model alone (no mechanism, optimizer, metrics)."""
        if save_type == "savedmodel":
            raise PrivacyContractError(
                "tf.saved_model.save of a DPModel would export the training wrapper (its traced "
                "training machinery and optimizer). Export the released model with "
                "tfdp_embed.keras2.export.export_saved_model(dp_model, path) (flushes and writes the "
                "privacy report) or dp_model.save(path)."
            )
        return {"inner": self.inner}


__all__ = ["ReleaseExits"]
