"""Noise mechanisms, one module each, registered by name in `MECHANISMS`.

Adding a mechanism: subclass `NoiseMechanism` in its own module, declare
its `capabilities` (`MechanismCapabilities`; undeclared means refused),
import it here and add one `name: class` line to `MECHANISMS`.
"""

from tfdp_embed.mechanisms.adafest import DPAdaFEST
from tfdp_embed.mechanisms.adafest_plus import DPAdaFESTPlus
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism, TableGradient, one_off_events
from tfdp_embed.mechanisms.capabilities import MechanismCapabilities, capabilities_of
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.eana import EANA
from tfdp_embed.mechanisms.fest import DPFEST
from tfdp_embed.mechanisms.lazy import LazyDP
from tfdp_embed.mechanisms.none import NonPrivate

MECHANISMS = {
    "none": NonPrivate,
    "dense": DenseDPSGD,
    "adafest": DPAdaFEST,
    "adafest+": DPAdaFESTPlus,
    "eana": EANA,
    "fest": DPFEST,
    "lazy": LazyDP,
}

__all__ = [
    "DPAdaFEST",
    "DPAdaFESTPlus",
    "DPFEST",
    "EANA",
    "MECHANISMS",
    "ClippedGradients",
    "MechanismCapabilities",
    "DenseDPSGD",
    "LazyDP",
    "NoiseMechanism",
    "NonPrivate",
    "TableGradient",
    "capabilities_of",
    "one_off_events",
]
