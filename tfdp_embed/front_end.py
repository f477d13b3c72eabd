"""Where the core reaches the Keras front end: one place, loaded only when a caller asks for a callback.

The core builds Keras-free trackers (`BudgetTracker`, `PeriodTracker`); a
caller that wants them as Keras callbacks (`RunPlan.budget()`,
`tfdp_embed.accounting.PrivacyBudget`) gets the front end's classes from
here: the Keras 3 front end's (`tfdp_embed.keras3.callbacks`) when the process
loaded it and not the tf-keras one, else tf-keras' (`tfdp_embed.keras2.callbacks`,
the default). A Keras 3 process that built its model with `tfdp_embed.keras3`
therefore gets Keras 3 callbacks, and its `tf.keras` is never switched.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

_FRONT_ENDS = {"keras2": "tfdp_embed.keras2", "keras3": "tfdp_embed.keras3"}


def loaded() -> str:
    """ "keras3" when the process loaded `tfdp_embed.keras3` and not `tfdp_embed.keras2`; else "keras2"."""
    if _FRONT_ENDS["keras3"] in sys.modules and _FRONT_ENDS["keras2"] not in sys.modules:
        return "keras3"
    return "keras2"


def callbacks() -> ModuleType:
    """The front end's callback module: `PrivacyBudget`, `PeriodBudget`, `epsilon_first`."""
    return importlib.import_module(_FRONT_ENDS[loaded()] + ".callbacks")


__all__ = ["callbacks", "loaded"]
