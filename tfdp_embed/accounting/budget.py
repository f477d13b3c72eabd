"""`PrivacyBudget`: a Keras callback that stops training before epsilon exceeds the target.

At train begin it finds, with the accountant, the largest number of further
steps k such that

    eps(ledger + setup_event + k * step_event, delta) <= target_epsilon

(everything already in the ledger counts: a resumed run spends only what is
left). The search runs on coarse PLD grids; the budget's own grid checks
the answer, k and k + 1 (`accounting.coarse_to_exact`), and a search that
runs over a second says so. It then records one step per batch in the ledger and sets
`model.stop_training = True` after the last allowed step, so the step that
would exceed the budget never runs. Epsilon is computed at epoch end (and
put into the epoch logs, so `History` sees it, and written to TensorBoard
by the callback itself: `log_dir`) and at train end, never per step: one
PLD evaluation costs ~0.1-2 s. Under `DPModel.fit` epsilon is in the epoch
logs before any callback reads them, whatever their order
(`accounting.epsilon_logs`), so Keras' `TensorBoard` writes it too.

Resuming (`resume_from(ledger)`, done by `tfdp_embed.keras2.checkpointing`): the
checkpointed ledger replaces the empty one, so a resumed run's budget counts
every step of every earlier run once, and stops at the same step an
uninterrupted run would. With `report_path` the callback writes the privacy
report (`privacy_report`, plus `extra.budget`: target, whether the budget
stopped training, allowed steps) when training ends, and also when it
refuses to start because not one more step fits.

Batching: the Poisson accounting holds only for Poisson-sampled batches.
At every train begin the callback reads what the model was fed
(`DPModel.batching`, recorded by `fit` from the data itself; Poisson only
for `tfdp_embed.data` samplers) and keeps the least private batching of all
its `fit` calls for the report. An explicit Poisson `batching` that the data
fed does not bear out is refused.

Non-DP mechanisms (`mechanism.is_dp` False, e.g. EANA) have no epsilon. The
callback still caps training at the step count DP-SGD with the same noise
multiplier would be allowed (a *nominal* number, useful to compare runs),
but logs it under `epsilon_not_dp` and says in every message that it is not
a differential-privacy guarantee.

Example:
    >>> budget = PrivacyBudget(mechanism, sampling_probability=q, target_epsilon=3.0,
    ...     target_delta=1e-5)
    >>> model.fit(poisson_ds, epochs=100, callbacks=[budget])  # stops at budget.max_steps
    >>> open("ledger.json", "w").write(budget.ledger.to_json())

References: Abadi et al. 2016 §3.1 (privacy accounting during training);
`dp_accounting` (PLD and RDP accountants).
"""

from __future__ import annotations

import logging
import os

import dp_accounting

from tfdp_embed.accounting.calibration import (
    check_accountant,
    check_delta,
    check_epsilon,
    check_sampling_probability,
    check_steps,
    entries_epsilon,
    epsilon_levels,
    pld_interval,
)
from tfdp_embed.accounting.coarse_to_exact import largest_count
from tfdp_embed.accounting.dataset_size import ReleasedDatasetSize
from tfdp_embed.accounting.events import EventSource, accountable_event, check_event_source, steps_taken
from tfdp_embed.accounting.ledger import PrivacyLedger
from tfdp_embed.accounting.progress import announced
from tfdp_embed.accounting.summaries import EpochScalars
from tfdp_embed.accounting.truncated import TruncatedSteps, check_matches_batching
from tfdp_embed.data.provenance import NOT_VERIFIED, UNVERIFIED, FedBatching
from tfdp_embed.errors import PrivacyBudgetExceededError, PrivacyContractError

_LOG = logging.getLogger(__name__)

# Upper end of the step search: a budget that allows more steps than this is
# treated as allowing exactly this many (2**40 steps is far beyond any run).
MAX_STEPS = 2**40


class BudgetTracker:
    """Stops `model.fit` at the last step that keeps epsilon within `target_epsilon`.

    Keras-free: the hooks have Keras callback names; a front end makes it a
    callback (`tfdp_embed.keras2.callbacks.PrivacyBudget`, which users get from
    `RunPlan.budget()` or `tfdp_embed.accounting.PrivacyBudget`).

    Args:
      mechanism: the `NoiseMechanism` that noises the training steps (any
        `EventSource`): its `step_event(q)` is one step's cost and its
        `one_off_events()` one-off costs (e.g. DP-FEST's selections, one per
        (re-)selection, counted with multiplicity).
      sampling_probability: Poisson sampling rate q in (0, 1].
      target_epsilon: epsilon budget > 0 for the whole run (all `fit` calls).
      target_delta: delta in (0, 1).
      accountant: "pld" (default) or "rdp".
      ledger: a `PrivacyLedger` to record into; pass the one saved by a
        previous run to resume (its steps and setup events count). A new
        empty ledger if None.
      initial_steps: steps taken before this run that the ledger does not
        hold (e.g. resuming from a checkpoint without a ledger). Defaults to
        `mechanism.steps`. The larger of the ledger's count and this is used.
      planned_steps: the total steps (ledger count) the caller plans, e.g.
        the steps the noise multiplier was calibrated for (`RunPlan.budget`
        passes its plan's). When they fit, train begin checks only them
        (see `max_steps`); the steps allowed do not depend on it. None:
        Keras' epochs x steps of each `fit`, when known.
      value_discretization_interval: PLD grid step (PLD only).
      report_path: where to write the privacy report JSON at train end (and
        when the budget refuses to start); None writes nothing.
      dataset_size: N~ (`release_dataset_size`) or N (stated as public), required with `report_path`.
      batching: None (default) reads it from the model at each train begin
        (`DPModel.batching`: what `fit` was fed). An explicit "poisson",
        "fixed_shuffled" or `BatchingInfo` is checked against it: claiming
        Poisson for data that is not verified (or declared) Poisson raises;
        a non-Poisson value is reported as given.
      log_dir: TensorBoard's `log_dir`: epsilon is written there (run
        "train", tag `epoch_epsilon`) at every epoch end, whatever the order
        of the callbacks. None writes it to the default summary writer if
        one is active (`accounting.summaries`).

    Attributes:
      ledger: the `PrivacyLedger` (save it next to the model).
      max_steps: total steps (ledger count) allowed; None before train begin.
        When the planned steps (`planned_steps`, else Keras' epochs x steps)
        fit, train begin checks only them and the search for the last step
        that fits runs when training goes past them or this is read.
      epsilon: the last epsilon computed (nominal for non-DP mechanisms).
      log_key: "epsilon", or "epsilon_not_dp" for non-DP mechanisms.
      stopped_by_budget: True once the callback stopped training.

    Raises:
      ValueError: bad arguments (at construction).
      PrivacyBudgetExceededError: at train begin, when the ledger already
        exceeds the budget or not even one more step fits.
      PrivacyContractError: at train begin, an explicit Poisson `batching`
        contradicting the data the model was fed.
    """

    def __init__(
        self,
        mechanism: EventSource,
        *,
        sampling_probability: float,
        target_epsilon: float,
        target_delta: float,
        accountant: str = "pld",
        ledger: PrivacyLedger | None = None,
        initial_steps: int | None = None,
        planned_steps: int | None = None,
        value_discretization_interval: float | None = None,
        report_path: str | None = None,
        dataset_size: int | ReleasedDatasetSize | None = None,
        batching=None,
        log_dir: str | os.PathLike | None = None,
    ):
        super().__init__()
        if (
            report_path is not None
            and not isinstance(dataset_size, ReleasedDatasetSize)
            and (isinstance(dataset_size, bool) or not isinstance(dataset_size, int) or dataset_size < 1)
        ):
            raise ValueError(
                "`dataset_size` (N~ from `release_dataset_size`, or an int >= 1 stated as public) is required with "
                f"`report_path`; received {dataset_size!r}."
            )
        check_event_source(mechanism)
        if ledger is not None and not isinstance(ledger, PrivacyLedger):
            raise TypeError(f"`ledger` must be a `PrivacyLedger` or None; received {type(ledger).__name__}.")
        self.mechanism = mechanism
        self.sampling_probability = check_sampling_probability(sampling_probability)
        self.target_epsilon = check_epsilon(target_epsilon)
        self.target_delta = check_delta(target_delta)
        self.accountant = check_accountant(accountant)
        self.initial_steps = (
            None if initial_steps is None else check_steps(initial_steps, "initial_steps", allow_zero=True)
        )
        self.planned_steps = None if planned_steps is None else check_steps(planned_steps, "planned_steps")
        self.value_discretization_interval = value_discretization_interval
        self.report_path = None if report_path is None else str(report_path)
        self.dataset_size = dataset_size
        self.batching = batching  # the caller's explicit claim, or None
        self.scalars = EpochScalars(log_dir)
        self.fed_batching: FedBatching | None = None  # the least private batching fed in this callback's fits
        self.ledger = PrivacyLedger() if ledger is None else ledger
        self.is_dp = bool(mechanism.is_dp)
        self.log_key = "epsilon" if self.is_dp else "epsilon_not_dp"
        self._max_steps: int | None = None
        self._fits_through: int | None = None  # a ledger count checked to fit, before the search
        self.epsilon: float | None = None
        self.stopped_by_budget = False
        self._step_event: dp_accounting.DpEvent | None = None
        self._batch_begin = 0
        self._epoch = 0
        self._epsilon_steps = -1  # ledger step count at which `epsilon` was computed

    # -- public helpers -----------------------------------------------------------
    def spent_epsilon(self) -> float:
        """Epsilon of everything in the ledger now (nominal for non-DP mechanisms)."""
        return self._epsilon_after(0)

    def resume_from(self, ledger: PrivacyLedger) -> None:
        """Continues from a checkpointed ledger: its steps and one-off events count, once.

        Call before `fit` (the checkpoint restore does). This budget's ledger
        must be empty or a prefix of `ledger` (see `PrivacyLedger.resume_from`).

        Raises:
          TypeError: not a PrivacyLedger. ValueError: this budget already
            recorded entries the checkpointed ledger lacks.
        """
        if not isinstance(ledger, PrivacyLedger):
            raise TypeError(f"`ledger` must be a `PrivacyLedger`; received {type(ledger).__name__}.")
        step_event = self.mechanism.step_event(self.sampling_probability)
        foreign = [e for e in ledger.entries if e.kind == "step" and e.event != step_event]
        if foreign:
            _LOG.warning(
                "PrivacyBudget.resume_from: %d checkpointed step entries have another event than this run's "
                "(%s); they are accounted as recorded.",
                len(foreign),
                step_event,
            )
        self.ledger.resume_from(ledger)
        self.max_steps = None
        self.epsilon, self._epsilon_steps = None, -1
        _LOG.info("PrivacyBudget: resumed from a ledger of %d steps.", self.ledger.steps)

    @property
    def max_steps(self) -> int | None:
        """Total steps (ledger count) allowed; None before train begin (searched when first needed)."""
        if self._max_steps is None and self._fits_through is not None:
            self._max_steps = self.ledger.steps + self._max_extra_steps(self._epsilon_after(0))
            self._fits_through = None
        return self._max_steps

    @max_steps.setter
    def max_steps(self, value: int | None) -> None:
        self._max_steps, self._fits_through = value, None

    @property
    def remaining_steps(self) -> int | None:
        """Steps still allowed (None before train begin)."""
        return None if self.max_steps is None else self.max_steps - self.ledger.steps

    # -- Keras hooks --------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self.stopped_by_budget = False
        self._check_batching()
        self._step_event = self.mechanism.step_event(self.sampling_probability)
        self._record_history()
        what = "epsilon" if self.is_dp else "NOMINAL epsilon (NOT a DP guarantee)"
        if not self.is_dp:
            _LOG.warning(
                "PrivacyBudget: mechanism %r is NOT differentially private. The budget below is the "
                "epsilon DP-SGD with the same noise multiplier would spend; it is logged as %r and "
                "is not a privacy guarantee for this model.",
                self.mechanism.name,
                self.log_key,
            )
        spent = self._epsilon_after(0)
        if spent > self.target_epsilon:
            self.epsilon, self._epsilon_steps = spent, self.ledger.steps
            self._write_report(stopped=True, refused_to_start=True)
            raise PrivacyBudgetExceededError(
                f"The ledger already spent {what} {spent:.6g} > `target_epsilon`={self.target_epsilon:g} "
                f"at delta={self.target_delta:g} ({self.ledger.steps} steps, {self.accountant} accountant): "
                "any further training step would release more than the budget allows. Allowed: a larger "
                "`target_epsilon`, or stop training."
            )
        if self._planned_steps_fit(spent, what):
            return
        remaining = self._max_extra_steps(spent)
        if remaining == 0:
            self.epsilon, self._epsilon_steps = spent, self.ledger.steps
            self.max_steps = self.ledger.steps
            self._write_report(stopped=True, refused_to_start=True)
            raise PrivacyBudgetExceededError(
                f"Not even one more step fits the budget: {what} is {spent:.6g} now and one more step "
                f"would exceed `target_epsilon`={self.target_epsilon:g} at delta={self.target_delta:g} "
                f"({self.ledger.steps} steps taken, {self.accountant} accountant)."
            )
        self.max_steps = self.ledger.steps + remaining
        self.epsilon, self._epsilon_steps = spent, self.ledger.steps
        _LOG.info(
            "PrivacyBudget: %d more steps allowed (%d in total) within %s %g at delta=%g "
            "(q=%g, %s accountant); %s spent so far: %.6g.",
            remaining,
            self.max_steps,
            what,
            self.target_epsilon,
            self.target_delta,
            self.sampling_probability,
            self.accountant,
            what,
            spent,
        )

    def _planned_steps_fit(self, spent: float, what: str) -> bool:
        """True when this run's expected steps fit (checked exactly); the full search then waits."""
        planned = self._expected_extra_steps()
        if not planned or planned < 1:
            return False
        after = self._epsilon_after(planned)
        if after > self.target_epsilon:
            return False
        self.max_steps, self._fits_through = None, self.ledger.steps + planned
        self.epsilon, self._epsilon_steps = spent, self.ledger.steps
        _LOG.info(
            "PrivacyBudget: the %d planned steps fit %s %g at delta=%g (q=%g, %s accountant; %.6g after "
            "them); the steps beyond them are counted if training goes on.",
            planned,
            what,
            self.target_epsilon,
            self.target_delta,
            self.sampling_probability,
            self.accountant,
            after,
        )
        return True

    def _last_batch(self, batch) -> bool:
        """True when no training step follows this batch (stopping, or the last batch of the last epoch)."""
        if self.model is not None and self.model.stop_training:
            return True
        params = getattr(self, "params", None) or {}
        epochs, steps = params.get("epochs"), params.get("steps")
        return isinstance(epochs, int) and isinstance(steps, int) and self._epoch == epochs - 1 and batch + 1 >= steps

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        # A one-off event added during training (e.g. a DP-FEST re-selection for a
        # new streaming period) shrinks what is left: recount before the epoch runs.
        started = self._max_steps is not None or self._fits_through is not None
        if started and self._record_setup_events():
            spent = self._epsilon_after(0)
            remaining = self._max_extra_steps(spent) if spent <= self.target_epsilon else 0
            self.max_steps = self.ledger.steps + remaining
            if remaining == 0:
                raise PrivacyBudgetExceededError(
                    f"A new one-off event (e.g. a re-selection) used up the budget: epsilon is {spent:.6g} "
                    f"and not one more step fits `target_epsilon`={self.target_epsilon:g}."
                )
            _LOG.info("PrivacyBudget: a new one-off event was recorded; %d more steps allowed.", remaining)

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_begin = int(batch)

    def on_train_batch_end(self, batch, logs=None):
        # tf-keras calls on_train_batch_end(begin + steps_per_execution - 1).
        taken = max(1, int(batch) - self._batch_begin + 1)
        self.ledger.record_steps(self._step_event, taken)
        steps = self.ledger.steps
        if self._fits_through is not None and (steps + taken <= self._fits_through or self._last_batch(batch)):
            return  # another execution stays within the planned steps, which fit, or none follows
        if self.max_steps is None:
            return
        if steps > self.max_steps:
            raise PrivacyBudgetExceededError(
                f"{steps} steps were taken but only {self.max_steps} fit the budget "
                f"`target_epsilon`={self.target_epsilon:g}: a multi-step execution "
                f"(`steps_per_execution`={taken}) crossed the limit. Do not release this model; use "
                "`steps_per_execution=1` with PrivacyBudget."
            )
        if self.max_steps - steps < taken and not self.model.stop_training:
            self.model.stop_training = True
            self.stopped_by_budget = True
            _LOG.warning(
                "PrivacyBudget: stopping training after step %d: one more step would exceed %s %g at "
                "delta=%g (%s accountant).",
                steps,
                "epsilon" if self.is_dp else "the NOMINAL (not DP) epsilon",
                self.target_epsilon,
                self.target_delta,
                self.accountant,
            )

    def on_epoch_end(self, epoch, logs=None):
        self.scalars.write(self.log_key, self.put_epsilon(logs), epoch=epoch)

    def put_epsilon(self, logs: dict | None) -> float:
        """Puts the current epsilon into `logs` under `log_key` and returns it (computed once per step count).

        `DPModel.fit` calls it at each epoch end before any other callback
        (`accounting.epsilon_logs`), so TensorBoard, CSVLogger or a user's
        callback read epsilon whatever their order in `callbacks`.
        """
        epsilon = self._current_epsilon()
        if logs is not None:
            logs[self.log_key] = epsilon
        return epsilon

    def on_train_end(self, logs=None):
        epsilon = self._current_epsilon()
        _LOG.info(
            "PrivacyBudget: training ended after %d steps; %s %.6g at delta=%g (%s accountant)%s.",
            self.ledger.steps,
            "epsilon" if self.is_dp else "NOMINAL epsilon (NOT a DP guarantee)",
            epsilon,
            self.target_delta,
            self.accountant,
            ", stopped by the privacy budget" if self.stopped_by_budget else "",
        )
        self._write_report(stopped=self.stopped_by_budget, refused_to_start=False)
        self.scalars.close()

    def _write_report(self, *, stopped: bool, refused_to_start: bool) -> None:
        """Writes the privacy report to `report_path` (if set), with the budget's outcome."""
        if self.report_path is None:
            return
        from tfdp_embed.accounting.report import privacy_report, write_privacy_report

        assert self.dataset_size is not None  # required with `report_path` (checked in __init__)

        budget = {
            "target_epsilon": self.target_epsilon,
            "target_delta": self.target_delta,
            "max_steps": self._max_steps,  # None: training never went past the planned steps, which fit
            "steps": self.ledger.steps,
            "stopped_by_budget": bool(stopped),
            "refused_to_start": bool(refused_to_start),
            "message": (
                "Not one more step fits the budget: training did not start."
                if refused_to_start
                else "Training stopped because one more step would exceed the budget."
                if stopped
                else "Training ended within the budget."
            ),
        }
        report = privacy_report(
            mechanism=self.mechanism,
            batching=self.report_batching(),
            delta=self.target_delta,
            sampling_probability=self.sampling_probability,
            dataset_size=self.dataset_size,
            ledger=self.ledger if self.is_dp else None,
            epsilon=None if self.is_dp else self.epsilon,
            steps=None if self.is_dp else self.ledger.steps,
            accountant=self.accountant,
            extra={"budget": budget},
        )
        write_privacy_report(self.report_path, report)
        _LOG.info("PrivacyBudget: privacy report written to %s.", self.report_path)

    def report_batching(self):
        """The batching the report states: the explicit non-Poisson value if given, else what was fed."""
        if self.batching is not None and not _claims_poisson(self.batching):
            return self.batching
        return self.fed_batching if self.fed_batching is not None else _not_recorded(None)

    # -- internals ----------------------------------------------------------------
    def _check_batching(self) -> None:
        """Records what the model was fed (the least private so far); refuses a false Poisson claim."""
        fed = getattr(self.model, "batching", None) or _not_recorded(self.model)
        if self.fed_batching is None or _rank(fed) > _rank(self.fed_batching):
            self.fed_batching = fed
        if self.batching is not None and _claims_poisson(self.batching) and not self.fed_batching.claims_poisson:
            raise PrivacyContractError(
                "PrivacyBudget was given `batching` Poisson, but the data fed to training is not Poisson-sampled "
                f"as far as tfdp_embed can tell: {self.fed_batching.description}. The Poisson epsilon would not "
                "describe this run. Feed batches from tfdp_embed.data.poisson_batches / "
                "streaming_poisson_batches, or drop `batching` (the report then says how the data was batched)."
            )
        if isinstance(self.mechanism, TruncatedSteps):  # truncated events describe only batches cut at that cap
            check_matches_batching(self.mechanism, fed.info.report() if fed.info is not None else None)

    def _record_setup_events(self) -> bool:
        """Records one-off events the ledger lacks (by multiplicity); True if any was new."""
        events = list(self.mechanism.one_off_events())
        recorded = [e.event for e in self.ledger.entries if e.kind == "setup"]
        new = False
        for event in {id(e): e for e in events}.values():
            missing = sum(e == event for e in events) - sum(e == event for e in recorded)
            for _ in range(max(0, missing)):
                self.ledger.record_setup(event)
                new = True
            recorded.extend([event] * max(0, missing))
        return new

    def _record_history(self) -> None:
        """Adds one-off events (once) and steps taken before this run to the ledger."""
        self._record_setup_events()
        known = self.ledger.steps
        sources = {"mechanism.steps": steps_taken(self.mechanism)}
        if self.initial_steps is not None:
            sources["initial_steps"] = self.initial_steps
        source, claimed = max(sources.items(), key=lambda kv: kv[1])
        if claimed > known:
            _LOG.info(
                "PrivacyBudget: counting %d steps taken before this run (%s=%d; the ledger held %d).",
                claimed - known,
                source,
                claimed,
                known,
            )
            self.ledger.record_steps(self._step_event, claimed - known)
        elif self.initial_steps is not None and self.initial_steps < known:
            _LOG.warning(
                "PrivacyBudget: `initial_steps`=%d is below the ledger's %d steps; the ledger's count is used.",
                self.initial_steps,
                known,
            )

    def _current_epsilon(self) -> float:
        if self._epsilon_steps != self.ledger.steps or self.epsilon is None:
            self.epsilon = self._epsilon_after(0)
            self._epsilon_steps = self.ledger.steps
        return self.epsilon

    def _epsilon_after(self, extra_steps: int, interval: float | None = None) -> float:
        """epsilon of the ledger plus `extra_steps` more steps (nominal events for non-DP), memoised."""
        if interval is None:
            interval = self.value_discretization_interval
        return entries_epsilon(
            self._entries_after(extra_steps), delta=self.target_delta, accountant=self.accountant, interval=interval
        )

    def _entries_after(self, extra_steps: int) -> tuple:
        """The ledger's `(event, count)` entries plus `extra_steps` more steps, as the accountant charges them."""
        step_event = self._accounting_event(self._step_event or self.mechanism.step_event(self.sampling_probability))
        entries = [(self._accounting_event(e.event), e.count) for e in self.ledger.entries]
        if extra_steps:
            entries.append((step_event, int(extra_steps)))
        return tuple(entries)

    def _accounting_event(self, event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        """The event as is for DP mechanisms; for non-DP ones, DP-SGD's (nominal) event if unsupported."""
        return accountable_event(
            event, source=self.mechanism, sampling_probability=self.sampling_probability, accountant=self.accountant
        )

    def _expected_extra_steps(self) -> int | None:
        """The steps this run expects to add: `planned_steps` less the ledger's, else Keras' epochs x steps."""
        if self.planned_steps is not None:
            return self.planned_steps - self.ledger.steps
        params = getattr(self, "params", None) or {}  # set by Keras once the callback joins a fit
        epochs, steps = params.get("epochs"), params.get("steps")
        return epochs * steps if isinstance(epochs, int) and isinstance(steps, int) else None

    def _max_extra_steps(self, spent: float) -> int:
        """Largest k >= 0 with eps(ledger + k steps) <= target < eps(ledger + k + 1 steps); eps(0) = `spent`.

        The search runs on coarse PLD grids first; the budget's own grid
        decides (`coarse_to_exact.largest_count`: it checks k and k + 1).
        """
        interval = pld_interval(self.accountant, self.value_discretization_interval)
        levels = epsilon_levels(
            self._entries_after, delta=self.target_delta, accountant=self.accountant, interval=interval
        )
        what = (
            f"epsilon={self.target_epsilon:g} at delta={self.target_delta:.3g} "
            f"(q={self.sampling_probability:.4g}, {self.accountant.upper()})"
        )
        with announced(f"PrivacyBudget: counting the steps that fit {what}") as note:
            k = largest_count(
                levels, self.target_epsilon, start=max(1, round(1.0 / self.sampling_probability)), highest=MAX_STEPS
            )
            note.result = f"PrivacyBudget: {k} more steps fit {what}"
        if k == MAX_STEPS:
            _LOG.warning("PrivacyBudget: the budget allows more than %d steps; capping there.", MAX_STEPS)
        return k


def _claims_poisson(batching) -> bool:
    """True when an explicit `batching` (string, BatchingInfo or FedBatching) states Poisson."""
    if isinstance(batching, FedBatching):
        return batching.claims_poisson
    name = batching if isinstance(batching, str) else getattr(batching, "batching", None)
    return name == "poisson"


def _rank(fed: FedBatching) -> int:
    """0: verified Poisson, 1: declared Poisson, 2: anything else (a run is as private as its worst fit)."""
    return 0 if fed.verified_poisson else 1 if fed.claims_poisson else 2


def _not_recorded(model) -> FedBatching:
    what = "no model" if model is None else f"model {getattr(model, 'name', '?')!r} ({type(model).__name__})"
    return FedBatching(
        UNVERIFIED, NOT_VERIFIED, f"{what} did not record the data it was fed (only DPModel.fit records it)"
    )


__all__ = ["MAX_STEPS", "BudgetTracker"]
