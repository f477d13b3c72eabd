"""Dense DP-SGD (Abadi et al. 2016): Gaussian noise on every coordinate.

   g = (sum_i clip_C(grad_i) + N(0, sigma^2 C^2 I)) / B_expected

Embedding tables get noise on every row, every step: the update is dense.
This is the baseline every sparse mechanism is measured against.

Example:
    >>> mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.1)  # no seed: OS entropy (ints are for tests)

References: Abadi et al. 2016, Alg. 1; DP-FEST §2 (dense baseline).
"""

from __future__ import annotations

from typing import cast

import dp_accounting
import tensorflow as tf

from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism
from tfdp_embed.mechanisms.capabilities import ALL_STRATEGIES, MechanismCapabilities
from tfdp_embed.mechanisms.row_noise import check_row_noise, stateless_row_normals


class DenseDPSGD(NoiseMechanism):
    """DP-SGD with noise on every coordinate of every trainable variable.

    Args (keyword-only, besides `NoiseMechanism`'s):
      row_noise: "generator" (default) draws table noise from the seeded
        `tf.random.Generator`; "stateless" (test mode, needs an int `seed`)
        keys row r's noise at step t by (seed, t, r), see
        `tfdp_embed.mechanisms.row_noise`, so LazyDP can reproduce it.
    """

    name = "dense"
    capabilities = MechanismCapabilities(
        strategies=ALL_STRATEGIES,
        needs_lookups=False,
        mixed_precision=True,
        noised_rows="all",
        user_level=True,
    )

    def __init__(
        self,
        *,
        l2_norm_clip: float,
        noise_multiplier: float,
        seed: int | None = None,
        row_noise: str = "generator",
    ):
        super().__init__(l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier, seed=seed)
        self.row_noise = check_row_noise(row_noise, self.seed)

    @tf.autograph.experimental.do_not_convert
    def update(self, clipped: ClippedGradients) -> list:
        std = self.noise_multiplier * self.l2_norm_clip
        out = self._dense_noised(clipped, self.noise_multiplier)
        batch = clipped.expected_batch_size
        for table in clipped.tables:
            var, sparse = table.variable, table.gradient
            if std > 0 and self.row_noise == "stateless":
                rows = tf.range(tf.shape(var)[0])
                seed = cast(int, self.seed)  # an int in the stateless mode (check_row_noise)
                noise = (std / batch) * stateless_row_normals(
                    seed=seed, steps=self.steps + 1, rows=rows, shape=var.shape[1:]
                )
            elif std > 0:
                noise = self._noise_like(tf.shape(var), std / batch)
            else:
                noise = tf.zeros_like(var)
            # One table-sized tensor (every row gets noise, drawn already divided by B);
            # the touched rows of the clipped sum are scattered into it.
            dense = tf.tensor_scatter_nd_add(noise, tf.cast(sparse.indices, tf.int64)[:, None], sparse.values / batch)
            out.append((dense, var))
        self.steps.assign_add(1)
        return out

    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        return dp_accounting.PoissonSampledDpEvent(
            sampling_probability, dp_accounting.GaussianDpEvent(self.noise_multiplier)
        )


__all__ = ["DenseDPSGD"]
