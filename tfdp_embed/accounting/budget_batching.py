"""The batching a `BudgetTracker` reports: the least private of its fits, and a Poisson claim checked against it."""

from __future__ import annotations

from tfdp_embed.accounting.events import EventSource
from tfdp_embed.accounting.truncated import TruncatedSteps, check_matches_batching
from tfdp_embed.data.provenance import NOT_VERIFIED, UNVERIFIED, FedBatching
from tfdp_embed.errors import PrivacyContractError


def fed_to(model) -> FedBatching:
    """What `model` was fed (`DPModel.batching`, recorded by `fit`), or that it recorded nothing."""
    return getattr(model, "batching", None) or not_recorded(model)


def least_private(so_far: FedBatching | None, fed: FedBatching) -> FedBatching:
    """The less private of `so_far` and `fed`: a run is as private as its worst fit."""
    return fed if so_far is None or _rank(fed) > _rank(so_far) else so_far


def check_batching(claimed, fed_so_far: FedBatching, fed: FedBatching, mechanism: EventSource) -> None:
    """Refuses an explicit Poisson `claimed` the data fed does not bear out, and truncated events on other batches."""
    if claimed is not None and claims_poisson(claimed) and not fed_so_far.claims_poisson:
        raise PrivacyContractError(
            "PrivacyBudget was given `batching` Poisson, but the data fed to training is not Poisson-sampled "
            f"as far as tfdp_embed can tell: {fed_so_far.description}. The Poisson epsilon would not "
            "describe this run. Feed batches from tfdp_embed.data.poisson_batches / "
            "streaming_poisson_batches, or drop `batching` (the report then says how the data was batched)."
        )
    if isinstance(mechanism, TruncatedSteps):  # truncated events describe only batches cut at that cap
        check_matches_batching(mechanism, fed.info.report() if fed.info is not None else None)


def report_batching(claimed, fed_so_far: FedBatching | None):
    """The batching the report states: the explicit non-Poisson `claimed` if given, else what was fed."""
    if claimed is not None and not claims_poisson(claimed):
        return claimed
    return fed_so_far if fed_so_far is not None else not_recorded(None)


def claims_poisson(batching) -> bool:
    """True when an explicit `batching` (string, BatchingInfo or FedBatching) states Poisson."""
    if isinstance(batching, FedBatching):
        return batching.claims_poisson
    name = batching if isinstance(batching, str) else getattr(batching, "batching", None)
    return name == "poisson"


def _rank(fed: FedBatching) -> int:
    """0: verified Poisson, 1: declared Poisson, 2: anything else (a run is as private as its worst fit)."""
    return 0 if fed.verified_poisson else 1 if fed.claims_poisson else 2


def not_recorded(model) -> FedBatching:
    """The batching of a `model` that did not record what it was fed."""
    what = "no model" if model is None else f"model {getattr(model, 'name', '?')!r} ({type(model).__name__})"
    return FedBatching(
        UNVERIFIED, NOT_VERIFIED, f"{what} did not record the data it was fed (only DPModel.fit records it)"
    )


__all__ = ["check_batching", "claims_poisson", "fed_to", "least_private", "not_recorded", "report_batching"]
