"""The non-private baseline: plain mini-batch SGD, no clipping, no noise.

It exists so that pipelines and benchmarks run the same model through the
same code with `--mechanism none`; its report says plainly that nothing is
private. It is never chosen implicitly.
"""

from __future__ import annotations

import dp_accounting

from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism
from tfdp_embed.mechanisms.capabilities import ALL_STRATEGIES, MechanismCapabilities


class NonPrivate(NoiseMechanism):
    """No clipping, no noise: the gradient of the mean loss (fast sparse path)."""

    name = "none"
    is_dp = False
    clips_per_example = False
    capabilities = MechanismCapabilities(
        strategies=ALL_STRATEGIES, tpu=True, needs_lookups=False, mixed_precision=True, user_level=True
    )

    def __init__(self, *, seed: int | None = None):
        super().__init__(l2_norm_clip=1.0, noise_multiplier=0.0, seed=seed)

    def update(self, clipped: ClippedGradients) -> list:  # pragma: no cover - not used
        raise NotImplementedError("NonPrivate training does not clip; DPModel applies plain gradients.")

    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        return dp_accounting.NonPrivateDpEvent()

    def report(self) -> dict:
        return {
            "mechanism": self.name,
            "is_dp": False,
            "l2_norm_clip": None,
            "noise_multiplier": 0.0,
            "caveats": ["Non-private training: no clipping and no noise; there is no privacy guarantee."],
        }


__all__ = ["NonPrivate"]
