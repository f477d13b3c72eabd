"""`fit` stopped after the planned number of steps (`--max-steps`), shared by the pipelines."""

from __future__ import annotations

from tfdp_embed import keras


class StopAfter(keras.callbacks.Callback):
    """Stops `fit` after `steps` batches, possibly inside an epoch: sigma was calibrated for exactly these."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps, self.seen = int(steps), 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen >= self.steps:
            self.model.stop_training = True
