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
from typing import Any, NoReturn

import dp_accounting

from tfdp_embed.accounting import budget_messages
from tfdp_embed.accounting.budget_batching import check_batching, fed_to, least_private, report_batching
from tfdp_embed.accounting.budget_history import record_earlier_steps, record_setup_events, warn_foreign_steps
from tfdp_embed.accounting.budget_report import check_report_dataset_size, write_budget_report
from tfdp_embed.accounting.budget_steps import entries_after, expected_extra_steps, is_last_batch, max_extra_steps
from tfdp_embed.accounting.calibration import (
    check_accountant,
    check_delta,
    check_epsilon,
    check_sampling_probability,
    check_steps,
    entries_epsilon,
)
from tfdp_embed.accounting.dataset_size import ReleasedDatasetSize
from tfdp_embed.accounting.events import EventSource, check_event_source
from tfdp_embed.accounting.ledger import PrivacyLedger
from tfdp_embed.accounting.summaries import EpochScalars
from tfdp_embed.data.provenance import FedBatching
from tfdp_embed.errors import PrivacyBudgetExceededError

_LOG = logging.getLogger(__name__)


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

    model: Any  # the model being trained, set by the front end (Keras' `set_model`)

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
        check_report_dataset_size(report_path, dataset_size)
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
        warn_foreign_steps(ledger, self.mechanism.step_event(self.sampling_probability))
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
        record_setup_events(self.ledger, self.mechanism)
        record_earlier_steps(self.ledger, self.mechanism, self._step_event, self.initial_steps)
        what = "epsilon" if self.is_dp else "NOMINAL epsilon (NOT a DP guarantee)"
        if not self.is_dp:
            budget_messages.not_dp(self)
        spent = self._epsilon_after(0)
        if spent > self.target_epsilon:
            self._refuse_to_start(spent, budget_messages.already_spent(self, what, spent))
        if self._planned_steps_fit(spent, what):
            return
        remaining = self._max_extra_steps(spent)
        if remaining == 0:
            self.max_steps = self.ledger.steps
            self._refuse_to_start(spent, budget_messages.no_step_fits(self, what, spent))
        self.max_steps = self.ledger.steps + remaining
        self.epsilon, self._epsilon_steps = spent, self.ledger.steps
        budget_messages.steps_allowed(self, remaining, what, spent)

    def _refuse_to_start(self, spent: float, message: str) -> NoReturn:
        """Writes the report of a run that did not start (epsilon `spent`) and raises `message`."""
        self.epsilon, self._epsilon_steps = spent, self.ledger.steps
        write_budget_report(self, max_steps=self._max_steps, stopped=True, refused_to_start=True)
        raise PrivacyBudgetExceededError(message)

    def _planned_steps_fit(self, spent: float, what: str) -> bool:
        """True when this run's expected steps fit (checked exactly); the full search then waits."""
        planned = expected_extra_steps(self.planned_steps, self.ledger.steps, getattr(self, "params", None) or {})
        if not planned or planned < 1:
            return False
        after = self._epsilon_after(planned)
        if after > self.target_epsilon:
            return False
        self.max_steps, self._fits_through = None, self.ledger.steps + planned
        self.epsilon, self._epsilon_steps = spent, self.ledger.steps
        budget_messages.planned_steps_fit(self, planned, what, after)
        return True

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        # A one-off event added during training (e.g. a DP-FEST re-selection for a
        # new streaming period) shrinks what is left: recount before the epoch runs.
        started = self._max_steps is not None or self._fits_through is not None
        if started and record_setup_events(self.ledger, self.mechanism):
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
        if self._fits_through is not None and (
            steps + taken <= self._fits_through
            or is_last_batch(self.model, getattr(self, "params", None) or {}, self._epoch, batch)
        ):
            return  # another execution stays within the planned steps, which fit, or none follows
        if self.max_steps is None:
            return
        if steps > self.max_steps:
            raise PrivacyBudgetExceededError(budget_messages.crossed_in_one_execution(self, steps, taken))
        if self.max_steps - steps < taken and not self.model.stop_training:
            self.model.stop_training = True
            self.stopped_by_budget = True
            budget_messages.stopping(self, steps)

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
        budget_messages.train_end(self, epsilon)
        write_budget_report(self, max_steps=self._max_steps, stopped=self.stopped_by_budget, refused_to_start=False)
        self.scalars.close()

    def report_batching(self):
        """The batching the report states: the explicit non-Poisson value if given, else what was fed."""
        return report_batching(self.batching, self.fed_batching)

    # -- internals ----------------------------------------------------------------
    def _check_batching(self) -> None:
        """Records what the model was fed (the least private so far); refuses a false Poisson claim."""
        fed = fed_to(self.model)
        self.fed_batching = least_private(self.fed_batching, fed)
        check_batching(self.batching, self.fed_batching, fed, self.mechanism)

    def _current_epsilon(self) -> float:
        if self._epsilon_steps != self.ledger.steps or self.epsilon is None:
            self.epsilon = self._epsilon_after(0)
            self._epsilon_steps = self.ledger.steps
        return self.epsilon

    def _epsilon_after(self, extra_steps: int) -> float:
        """epsilon of the ledger plus `extra_steps` more steps (nominal events for non-DP), memoised."""
        interval = self.value_discretization_interval
        return entries_epsilon(
            self._entries_after(extra_steps), delta=self.target_delta, accountant=self.accountant, interval=interval
        )

    def _entries_after(self, extra_steps: int) -> tuple:
        """The ledger's `(event, count)` entries plus `extra_steps` more steps, as the accountant charges them."""
        return entries_after(
            self.ledger,
            self._step_event or self.mechanism.step_event(self.sampling_probability),
            extra_steps,
            source=self.mechanism,
            sampling_probability=self.sampling_probability,
            accountant=self.accountant,
        )

    def _max_extra_steps(self, spent: float) -> int:
        """Largest k >= 0 with eps(ledger + k steps) <= target < eps(ledger + k + 1 steps); eps(0) = `spent`."""
        return max_extra_steps(
            self._entries_after,
            target_epsilon=self.target_epsilon,
            target_delta=self.target_delta,
            sampling_probability=self.sampling_probability,
            accountant=self.accountant,
            value_discretization_interval=self.value_discretization_interval,
        )


__all__ = ["BudgetTracker"]
