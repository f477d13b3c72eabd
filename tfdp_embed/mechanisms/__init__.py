"""Noise mechanisms, one module each, built by name with `create` (`MECHANISMS`: name -> class).

Adding a mechanism: subclass `NoiseMechanism` in its own module, declare
its `capabilities` (`MechanismCapabilities`; undeclared means refused),
and add one `name: class` line to `_REGISTRY` in `factory.py` (a library
mechanism) or call `register_mechanism(name, cls)` (a user's).
"""

from tfdp_embed.mechanisms.adafest import DPAdaFEST
from tfdp_embed.mechanisms.adafest_plus import DPAdaFESTPlus
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism, TableGradient, one_off_events
from tfdp_embed.mechanisms.capabilities import MechanismCapabilities, capabilities_of
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.eana import EANA
from tfdp_embed.mechanisms.factory import MECHANISMS, create, mechanism_class, options, register_mechanism
from tfdp_embed.mechanisms.fest import DPFEST
from tfdp_embed.mechanisms.lazy import LazyDP
from tfdp_embed.mechanisms.none import NonPrivate

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
    "create",
    "mechanism_class",
    "one_off_events",
    "options",
    "register_mechanism",
]
