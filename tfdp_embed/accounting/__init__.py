"""Privacy accounting with `dp_accounting` only: calibration, releases, ledger, budgets, periods, report (JSON, text).

Events are data (`dp_accounting.DpEvent`s reported by the mechanisms, read
through `EventSource`), accountants (PLD by default, RDP) interpret them;
nothing here is a second accountant, and nothing here imports
`tfdp_embed.mechanisms` (`tfdp_embed.planning` joins the two). EANA's
data-dependent bound lives in `tfdp_embed.accounting.eana_bound` (not
imported here).
"""

from tfdp_embed.accounting.budget import BudgetTracker
from tfdp_embed.accounting.calibration import (
    calibrate,
    calibrate_noise_multiplier,
    compute_epsilon,
    dpsgd_event,
    make_accountant,
)
from tfdp_embed.accounting.contribution_bound import ReleasedContributionBound, release_contribution_bound
from tfdp_embed.accounting.dataset_size import ReleasedDatasetSize, release_dataset_size
from tfdp_embed.accounting.events import EventSource, accountable_event
from tfdp_embed.accounting.group_privacy import group_epsilon
from tfdp_embed.accounting.ledger import PrivacyLedger
from tfdp_embed.accounting.one_off_releases import (
    calibrate_noise_multiplier_with_releases,
    release_epsilon,
    release_noise_multiplier,
)
from tfdp_embed.accounting.periods import (
    AccountingPeriod,
    PeriodTracker,
    calibrate_periods,
    period_ledger,
    period_ledgers,
)
from tfdp_embed.accounting.report import (
    privacy_report,
    read_privacy_report,
    truncation_delta,
    write_privacy_report,
)
from tfdp_embed.accounting.report_text import format_report
from tfdp_embed.accounting.tradeoff import gdp_mu_clt, pld_tpr_bounds
from tfdp_embed.accounting.truncated import TruncatedSteps, truncate_event, truncated_steps


def __getattr__(name: str):
    """`PrivacyBudget` and `PeriodBudget`: the front end's callbacks (loading it), kept here for existing code."""
    if name in ("PrivacyBudget", "PeriodBudget"):
        from tfdp_embed import front_end

        return getattr(front_end.callbacks(), name)
    raise AttributeError(f"module 'tfdp_embed.accounting' has no attribute {name!r}")


__all__ = [
    "group_epsilon",
    "AccountingPeriod",
    "BudgetTracker",
    "EventSource",
    "PeriodBudget",
    "PeriodTracker",
    "PrivacyBudget",
    "PrivacyLedger",
    "ReleasedContributionBound",
    "ReleasedDatasetSize",
    "accountable_event",
    "calibrate",
    "calibrate_noise_multiplier",
    "calibrate_noise_multiplier_with_releases",
    "calibrate_periods",
    "compute_epsilon",
    "dpsgd_event",
    "format_report",
    "gdp_mu_clt",
    "make_accountant",
    "period_ledger",
    "period_ledgers",
    "pld_tpr_bounds",
    "privacy_report",
    "read_privacy_report",
    "release_contribution_bound",
    "release_dataset_size",
    "release_epsilon",
    "release_noise_multiplier",
    "truncation_delta",
    "TruncatedSteps",
    "truncate_event",
    "truncated_steps",
    "write_privacy_report",
]
