"""EANA (embedding-aware noise addition): noise only on the embedding rows a batch touches.

Per step, for each embedding table, with T_t the rows the batch touches:

    g_rows = (sum_i c_i grad_i [rows T_t] + N(0, sigma^2 C^2 I_{|T_t| x dim})) / B_expected

and dense DP-SGD, (sum_i c_i grad_i + N(0, sigma^2 C^2 I)) / B_expected, on
every other variable (Alg. 2: delta_E noises the embedding parameters with
non-zero gradient). The update stays sparse: cost O(|T_t| x dim) per step.

**EANA is not differentially private.** Rows outside T_t are not changed at
all, so anyone who sees two consecutive models learns exactly which rows
(which items, words, users' ids) the batch contained, and even the final
model shows which rows were never used. There is no epsilon for it: its
`step_event` is `dp_accounting.UnsupportedDpEvent`, which every accountant
refuses to compose. What exists is a data-dependent bound for the final model
of a linear model (Theorem 3.1, `tfdp_embed.accounting.eana_bound`) and
empirical audits (the secret-sharer test, EANA §4).

Example:
    >>> mechanism = EANA(l2_norm_clip=1.0, noise_multiplier=0.01)  # no seed: OS entropy (ints are for tests)
    >>> mechanism.is_dp
    False

References: Berlowitz et al., "EANA: Reducing Privacy Risk on Large-scale
Recommendation Models", RecSys 2022: §3, Alg. 2; §3.1 (why it is not DP).
"""

from __future__ import annotations

import dp_accounting
import tensorflow as tf

from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism
from tfdp_embed.mechanisms.capabilities import ALL_STRATEGIES, MechanismCapabilities

NOT_DP_CAVEAT = (
    "EANA is NOT differentially private and no epsilon is reported for it. Noise is added "
    "only to the embedding rows touched in each batch; untouched rows stay exactly "
    "unchanged, so the set of rows that changed at each step (which ids were in the batch) "
    "is released without any noise, and the final model still shows which rows were never "
    "used. Any epsilon computed for DP-SGD with the same noise multiplier does not apply."
)
BOUND_CAVEAT = (
    "A data-dependent RDP bound for the final model of a linear model, valid only when every "
    "row received at least C_0 noise draws, is available from "
    "tfdp_embed.accounting.eana_bound (EANA Theorem 3.1 / Remark 2); it is not a DP guarantee. "
    "Measure empirical leakage with the secret-sharer audit."
)


class EANA(NoiseMechanism):
    """Gaussian noise on touched embedding rows only; dense DP-SGD elsewhere. Not DP.

    Args (keyword-only):
      l2_norm_clip: per-example clip norm C (> 0).
      noise_multiplier: sigma (>= 0); a touched row coordinate gets N(0, sigma^2 C^2).
      seed: int for reproducible noise (tests), None for OS entropy.

    Raises:
      ValueError: on C <= 0 or sigma < 0.

    References: EANA (RecSys 2022) §3, Alg. 2.
    """

    name = "eana"
    is_dp = False
    capabilities = MechanismCapabilities(
        strategies=ALL_STRATEGIES,
        tpu=True,
        needs_lookups=False,
        mixed_precision=True,
        noised_rows="touched",
        user_level=True,
    )

    @tf.autograph.experimental.do_not_convert
    def update(self, clipped: ClippedGradients) -> list:
        """Noises the touched rows (IndexedSlices) and the dense variables; divides by B."""
        std = self.noise_multiplier * self.l2_norm_clip
        # One generator draw for the step: dense variables and touched rows (unique
        # indices) are noised as independent streams of one key.
        dense = [grad for _, grad in clipped.dense]
        touched = [table.gradient.values for table in clipped.tables]
        noised = self._noised_sums(dense + touched, std, clipped.expected_batch_size)
        out = [(grad, variable) for grad, (variable, _) in zip(noised, clipped.dense)]
        for table, values in zip(clipped.tables, noised[len(dense) :]):
            grad = table.gradient
            out.append((tf.IndexedSlices(values, grad.indices, grad.dense_shape), table.variable))
        self.steps.assign_add(1)
        return out

    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        """`UnsupportedDpEvent`: EANA has no DP guarantee, so no accountant may compose it.

        A nominal DP-SGD event (Poisson-sampled Gaussian with the same sigma)
        would let a ledger print an epsilon that looks like a guarantee and is
        not one; `UnsupportedDpEvent` makes `PLDAccountant`/`RdpAccountant`
        raise `UnsupportedEventError` instead. See `report()` for the caveat
        and `tfdp_embed.accounting.eana_bound` for the data-dependent bound.
        """
        del sampling_probability
        return dp_accounting.UnsupportedDpEvent()

    def report(self) -> dict:
        return {
            "mechanism": self.name,
            "is_dp": False,
            "guarantee": "none: EANA is not differentially private",
            "l2_norm_clip": self.l2_norm_clip,
            "noise_multiplier": self.noise_multiplier,
            "noised_rows": "rows touched in each batch only (untouched rows unchanged)",
            "caveats": [NOT_DP_CAVEAT, BOUND_CAVEAT],
        }


__all__ = ["BOUND_CAVEAT", "EANA", "NOT_DP_CAVEAT"]
