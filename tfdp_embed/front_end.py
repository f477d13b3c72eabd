"""Where the core reaches the Keras front end: one place, loaded only when a caller asks for a callback.

The core builds Keras-free trackers (`BudgetTracker`, `PeriodTracker`); a
caller that wants them as Keras callbacks (`RunPlan.budget()`,
`tfdp_embed.accounting.PrivacyBudget`) gets the front end's classes from
here. Today the one front end is tf-keras (`tfdp_embed.keras2`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

_CALLBACKS = "tfdp_embed.keras2.callbacks"


def callbacks() -> ModuleType:
    """The front end's callback module: `PrivacyBudget`, `PeriodBudget`, `epsilon_first`."""
    return importlib.import_module(_CALLBACKS)


__all__ = ["callbacks"]
