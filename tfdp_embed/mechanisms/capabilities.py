"""What a noise mechanism declares it can do; anything it does not declare is refused.

Every `NoiseMechanism` class carries a `capabilities` class attribute, a
frozen `MechanismCapabilities`, inherited by subclasses. The library reads
it, never the mechanism's `name`, to decide:

* which `tf.distribute` strategies it may run under (`tfdp_embed.keras2.distribute`
  refuses the others at `DPModel` construction and again at `prepare`),
  and how many ParameterServerStrategy workers;
* whether it runs with its tables on the TPU embedding engine (`TpuDPStep`);
* whether it takes the next batch's ids (`DPModel(lookahead=True)`);
* whether it defers noise between steps (it must then implement `flush` and
  `owes_noise`; releases flush first and refuse owed noise either way);
* whether it reports one-off accounting events (`setup_event`,
  `selection_events`) that a budget or report must compose;
* whether it trains models whose layers compute in float16 or bfloat16
  (Keras' `mixed_float16` / `mixed_bfloat16` policies; `DPModel` refuses
  them at construction otherwise).

The base `NoiseMechanism` declares one device only, so a new mechanism (or
one that copies a library mechanism's `name`) runs nowhere else until its
author declares more. `class MyLazy(LazyDP)` inherits LazyDP's declaration.

Example:
    >>> class MyMechanism(NoiseMechanism):
    ...     capabilities = MechanismCapabilities(
    ...         strategies=(ONE_DEVICE, MIRRORED), needs_lookups=False)

References: STYLE.md §5 (match with isinstance, never by name); TFRS
`composite_optimizer.py` (unhandled variables are an error, not a default).
"""

from __future__ import annotations

import dataclasses

# Strategy kinds (the names `tfdp_embed.keras2.distribute.strategy_kind` returns).
ONE_DEVICE = "default"
MIRRORED = "mirrored"
MULTI_WORKER_MIRRORED = "multi_worker_mirrored"
PARAMETER_SERVER = "parameter_server"
STRATEGY_KINDS = (ONE_DEVICE, MIRRORED, MULTI_WORKER_MIRRORED, PARAMETER_SERVER)
ALL_STRATEGIES = STRATEGY_KINDS
NOISED_ROWS = ("all", "selected", "thresholded", "touched", None)

STRATEGY_TITLES = {
    ONE_DEVICE: "one device",
    MIRRORED: "MirroredStrategy",
    MULTI_WORKER_MIRRORED: "MultiWorkerMirroredStrategy",
    PARAMETER_SERVER: "ParameterServerStrategy",
}


@dataclasses.dataclass(frozen=True)
class MechanismCapabilities:
    """A mechanism's declared capabilities (a class attribute, inherited by subclasses).

    Attributes:
      strategies: strategy kinds the mechanism runs under (`ONE_DEVICE`,
        `MIRRORED`, `MULTI_WORKER_MIRRORED`, `PARAMETER_SERVER`). Declare a
        synchronous strategy only if `update` adds all of a step's noise
        (its state changes included) exactly once, in cross-replica context.
      parameter_server_workers: the most ParameterServerStrategy workers it
        supports (None: any number); e.g. 1 for state that asynchronous
        workers would race on.
      tpu: runs with its tables on the TPU embedding engine (`TpuDPStep`;
        the recipe is in `tfdp_embed.keras2.distribute.TPU_PLANS`).
      lookahead: consumes the next batch's ids in `after_apply`
        (`DPModel(lookahead=True)`).
      defers_noise: leaves noise owed between steps; it overrides `flush`
        and `owes_noise`, and only flushed models are released.
      one_off_events: `setup_event` / `selection_events` may return one-off
        accounting events (e.g. a DP selection) that budgets and reports compose.
      needs_lookups: `update` reads `TableGradient.occurrences` /
        `clip_factors` (gathered from every replica under synchronous
        strategies; False skips that collective).
      mixed_precision: it trains models computing in float16 or bfloat16
        with float32 variables (`tfdp_embed.keras2.mixed_precision`): its state,
        noise and updates stay in the variables' dtype whatever the
        gradients' compute dtype was. Declare it only with a test under
        both mixed policies.
      noised_rows: which embedding rows a step noises, for gradient-size
        reports: "all" (every row), "selected" (the DP-selected `top_k`
        rows), "thresholded" (rows surviving a noisy threshold; the
        mechanism reports `gradient_size_fraction()`), "touched" (the rows
        a batch reads), or None (no noise, or not reported).
      reselects: re-runs its DP selection on each streaming period's counts
        (`reselect(counts)`), one selection event per period.
      read_hooks: installs hooks on its tables' reads (LazyDP's catch-up);
        after the release flush, `detach()` removes them so evaluation and
        export read plain tables.
      user_level: trains on user-level batches (`tfdp_embed.data.poisson_user_batches`,
        one user = one example of the batch): everything it derives from the
        batch is per example, hence per user (`tfdp_embed.contract.unit_axis`).
      why_not: `(strategy kind, reason)` pairs explaining refusals in errors.

    Raises:
      ValueError: an unknown strategy kind or a bad worker limit.
    """

    strategies: tuple = (ONE_DEVICE,)
    parameter_server_workers: int | None = None
    tpu: bool = False
    lookahead: bool = False
    defers_noise: bool = False
    one_off_events: bool = False
    needs_lookups: bool = True
    mixed_precision: bool = False
    noised_rows: str | None = None
    reselects: bool = False
    read_hooks: bool = False
    user_level: bool = False
    why_not: tuple = ()

    def __post_init__(self):
        strategies = tuple(self.strategies)
        unknown = [s for s in strategies if s not in STRATEGY_KINDS]
        if unknown:
            raise ValueError(f"`strategies` holds unknown kinds {unknown}; allowed: {list(STRATEGY_KINDS)}.")
        object.__setattr__(self, "strategies", strategies)
        if self.noised_rows not in NOISED_ROWS:
            raise ValueError(f"`noised_rows` must be one of {list(NOISED_ROWS)}; received {self.noised_rows!r}.")
        workers = self.parameter_server_workers
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"`parameter_server_workers` must be an int >= 1 or None; received {workers!r}.")
        object.__setattr__(self, "why_not", tuple((str(k), str(r)) for k, r in self.why_not))

    def supports(self, kind: str) -> bool:
        """True when strategy kind `kind` is declared."""
        return kind in self.strategies

    def reason(self, kind: str) -> str | None:
        """The declared reason for refusing `kind`, if any."""
        return dict(self.why_not).get(kind)


def capabilities_of(mechanism) -> MechanismCapabilities:
    """The capabilities declared by `mechanism`'s class (an instance or a class).

    Read from the class, so an instance attribute cannot widen them.

    Raises:
      TypeError: the class's `capabilities` is not a `MechanismCapabilities`.
    """
    cls = mechanism if isinstance(mechanism, type) else type(mechanism)
    declared = getattr(cls, "capabilities", None)
    if not isinstance(declared, MechanismCapabilities):
        raise TypeError(
            f"Mechanism class {cls.__name__} declares `capabilities` = {declared!r}; it must be a "
            "tfdp_embed.mechanisms.MechanismCapabilities."
        )
    return declared


def declaring_class(mechanism) -> type:
    """The class in `mechanism`'s MRO that declared its capabilities (for error messages)."""
    cls = mechanism if isinstance(mechanism, type) else type(mechanism)
    for klass in cls.__mro__:
        if "capabilities" in vars(klass):
            return klass
    return cls


def how_to_declare(mechanism, what: str) -> str:
    """One sentence for refusals: where the capabilities came from and how to declare `what`."""
    cls = mechanism if isinstance(mechanism, type) else type(mechanism)
    origin = declaring_class(cls)
    inherited = "" if origin is cls else f" (inherited from {origin.__name__})"
    return (
        f"Mechanism class {cls.__name__} (name {getattr(cls, 'name', '?')!r}) does not declare {what} in its "
        f"`capabilities`{inherited}. Capabilities are declared on the class, never taken from `name`: if "
        f"the mechanism really supports it, set `capabilities = MechanismCapabilities(...)` on "
        f"{cls.__name__} (tfdp_embed.mechanisms.MechanismCapabilities)."
    )


__all__ = [
    "ALL_STRATEGIES",
    "MIRRORED",
    "MULTI_WORKER_MIRRORED",
    "ONE_DEVICE",
    "PARAMETER_SERVER",
    "STRATEGY_KINDS",
    "STRATEGY_TITLES",
    "MechanismCapabilities",
    "capabilities_of",
    "declaring_class",
    "how_to_declare",
]
