"""Exceptions raised by tfdp_embed."""


class PrivacyContractError(RuntimeError):
    """An operation would break the differential-privacy guarantee.

    The message always says which guarantee would break and why, e.g. a
    trainable variable that no mechanism noises, a loss that is not
    per-example, or exporting a LazyDP model that still owes noise.
    """


class PrivacyBudgetExceededError(PrivacyContractError):
    """Training would spend more privacy budget than the target allows."""


__all__ = ["PrivacyBudgetExceededError", "PrivacyContractError"]
