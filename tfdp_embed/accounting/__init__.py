"""Privacy accounting with `dp_accounting` only: calibration, planning, ledger, budget callback, report.

Events are data (`dp_accounting.DpEvent`s reported by the mechanisms),
accountants (PLD by default, RDP) interpret them; nothing here is a second
accountant. EANA's data-dependent bound lives in
`tfdp_embed.accounting.eana_bound` (not imported here).
"""

from tfdp_embed.accounting.budget import PrivacyBudget
from tfdp_embed.accounting.calibration import (
    calibrate_noise_multiplier,
    compute_epsilon,
    dpsgd_event,
    make_accountant,
)
from tfdp_embed.accounting.ledger import PrivacyLedger
from tfdp_embed.accounting.planning import (
    calibrate_noise_multiplier_with_releases,
    release_epsilon,
    release_noise_multiplier,
)
from tfdp_embed.accounting.report import (
    privacy_report,
    read_privacy_report,
    truncation_delta,
    write_privacy_report,
)

__all__ = [
    "PrivacyBudget",
    "PrivacyLedger",
    "calibrate_noise_multiplier",
    "calibrate_noise_multiplier_with_releases",
    "compute_epsilon",
    "dpsgd_event",
    "make_accountant",
    "privacy_report",
    "read_privacy_report",
    "release_epsilon",
    "release_noise_multiplier",
    "truncation_delta",
    "write_privacy_report",
]
