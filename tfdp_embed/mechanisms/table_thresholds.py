"""DP-AdaFEST's survival threshold tau: one value for every table, or one per table.

The noisy contribution count of a row is compared with tau; the right tau
depends on how many examples touch a table's rows (a user-id table and a
genre table of one model see very different counts), so the README's advice
"choose tau per vocabulary" needs one tau per table: `threshold=5.0` or
`threshold={"user_id": 5.0, "genres": 40.0}` (every table named). Each tau
fixes the probability p = P(N(0, sigma1^2 C1^2) >= tau) that an untouched row
of that table survives by noise alone.

tau is a hyperparameter, not data: choosing it per table costs no privacy.

References: DP-AdaFEST §3.2, App. B.2 (survival probability), App. D.1 (tau tuned).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

from tfdp_embed._checks import check_positive

# Above this survival probability of an untouched row, the "sparse" gradient
# covers a sizeable fraction of every table each step: warn the user.
DENSE_WARNING_PROBABILITY = 0.05


def survival_probability(threshold: float, scale: float) -> float:
    """P(N(0, scale^2) >= threshold)."""
    return 0.5 * math.erfc(threshold / (scale * math.sqrt(2.0)))


class TableThresholds:
    """tau per table: a number for all, or a mapping from table (layer) name to tau.

    Args:
      threshold: tau >= 0, or `{table_name: tau}` naming every table.
      scale: sigma1 * C1, the contribution map's noise std.

    Raises:
      ValueError: a tau < 0 or not a number; at `bind`, tables missing from
        the mapping or names that are not tables.
    """

    def __init__(self, threshold, *, scale: float):
        self.scale = scale
        if isinstance(threshold, Mapping):
            if not threshold:
                raise ValueError("`threshold` is an empty mapping: give tau for every table, or one number.")
            self.per_table: dict[str, float] | None = {
                str(name): check_positive(f"threshold[{name!r}]", value, allow_zero=True)
                for name, value in threshold.items()
            }
            self.default: float | None = None
        else:
            self.per_table = None
            self.default = check_positive("threshold", threshold, allow_zero=True)
        self._taus: list = []
        for where, tau in self._items():
            p = survival_probability(tau, scale)
            if p > DENSE_WARNING_PROBABILITY:
                warnings.warn(
                    f"DP-AdaFEST: `threshold`{where}={tau} with contribution noise std sigma1*C1={scale:g} "
                    f"lets each untouched row through with probability {p:.3g} per step, so that fraction "
                    f"of {'every table' if not where else 'the table'} is noised each step. Raise "
                    f"`threshold`{where} or lower `contribution_noise_multiplier` for a sparse gradient.",
                    stacklevel=4,
                )

    def _items(self) -> list:
        if self.per_table is None:
            return [("", self.default)]
        return [(f"[{name!r}]", tau) for name, tau in self.per_table.items()]

    @property
    def given(self):
        """The threshold as given: a number or a `{table: tau}` dict."""
        return self.default if self.per_table is None else dict(self.per_table)

    def probability(self):
        """p for the scalar threshold, or `{table: p}` for a mapping."""
        if self.per_table is None:
            return survival_probability(self.default, self.scale)
        return {name: survival_probability(tau, self.scale) for name, tau in self.per_table.items()}

    def bind(self, tables: Sequence) -> None:
        """Resolves tau for each table (by index, in `tables` order)."""
        names = [t.name for t in tables]
        if self.per_table is not None:
            missing = [n for n in names if n not in self.per_table]
            unused = sorted(set(self.per_table) - set(names))
            if missing or unused:
                raise ValueError(
                    f"`threshold` must give tau for exactly the model's tables {names}; "
                    f"missing {missing}, not tables {unused}."
                )
        self._taus = [self.default if self.per_table is None else self.per_table[n] for n in names]

    def tau(self, index: int) -> float:
        return self._taus[index]

    def survival(self, index: int) -> float:
        """p of table `index`: an untouched row passes tau by noise alone."""
        return survival_probability(self._taus[index], self.scale)


__all__ = ["DENSE_WARNING_PROBABILITY", "TableThresholds", "survival_probability"]
