"""`TrainingCheckpoint`: save and restore ALL the state of a DP training run, or nothing.

One checkpoint holds, under the object-graph root `training_state`:

* `model`: the wrapped Keras model's variables;
* `optimizer`: iterations, hyperparameter variables, slots (momentum, ...);
* `mechanism`: step counter, noise RNG state (only with an explicit seed: an unseeded run never writes it), and
  the mechanism's own variables: LazyDP's per-row histories and per-step
  noise sums, DP-FEST's selected rows, DP-AdaFEST's counters;

and under `progress`: the `PrivacyLedger` as JSON (a string variable, so it
is written atomically with the weights it accounts for) and the position in
the batch stream (`DataPosition`). Beside it a manifest
(`tfdp_embed.checkpointing.manifest`) records what wrote it and the files'
checksums; only checkpoints with a manifest are complete.

Restoring never replays noise: with `seed=None` the mechanism's generators
(the noise generator, LazyDP's catch-up stream) are re-keyed from OS entropy
right after the restore (`NoiseMechanism.rekey_from_entropy`); only explicit
seeds (tests) keep the saved state, so that a resumed run reproduces an
uninterrupted one.

Restoring is all-or-nothing: the manifest is compared with the current
model, optimizer, mechanism and accounting setup, and the files with their
checksums, BEFORE anything is read; any difference raises
`CheckpointMismatchError` / `CheckpointCorruptedError` and leaves every
variable's value as it was (only the optimizer's fresh slots may have been
created, by a zero-gradient step whose counter increment is undone). Then every value of the checkpoint must find its
variable (`assert_consumed`).

LazyDP (un-flushed tables). A checkpoint is training state, not a release:
it stores LazyDP's table together with its per-row history (the noise each
row still owes), under `training_state`, and the manifest says
`progress.owes_noise`. It is NOT flushed before writing: a flush draws the
owed noise early, which is exact (catching a row up early gives it the same
Gaussian), but costs O(vocabulary) per checkpoint and makes the realised
noise depend on when checkpoints are taken, so a resumed run would no
longer reproduce a run that was never interrupted. Restoring
re-attaches table and history together (the mechanism's `steps` and
`flushed_at` are restored too, so `owes_noise()` is true again), and the
ways out of training (`tfdp_embed.release.export_saved_model`, `DPModel`'s
`save_weights` / `save` / `get_weights`, and every eager read of the table,
see `tfdp_embed.read_guard`) flush first; only this checkpoint reads the
table raw. A plain `model.load_weights(<checkpoint>)`
finds no model at the root (it is under `training_state`): Keras refuses
("Nothing except the root object matched") and loads nothing. The table stored here is therefore never "the model".

Example:
    >>> ckpt = TrainingCheckpoint("/tmp/run", dp_model=dp, budget=budget)
    >>> resumed = ckpt.restore_or_initialize()   # None on a fresh start
    >>> ...train...; ckpt.save(position=...)

References: `tf.train.Checkpoint`, `tf.train.CheckpointManager`; LazyDP
(ASPLOS 2024) §3 (only flushed models are released).
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import re

import tensorflow as tf

from tfdp_embed import read_guard
from tfdp_embed._version import __version__
from tfdp_embed.accounting.ledger import PrivacyLedger
from tfdp_embed.checkpointing import manifest as manifest_lib
from tfdp_embed.checkpointing.errors import (
    CheckpointCorruptedError,
    CheckpointError,
    CheckpointMismatchError,
)
from tfdp_embed.checkpointing.position import DataPosition, normalized_position
from tfdp_embed.clipping.layer_kinds import tf_variable
from tfdp_embed.clipping.taps import submodules
from tfdp_embed.layers.lookup import EmbeddingLookup

_LOG = logging.getLogger(__name__)
CHECKPOINT_NAME = "ckpt"
_NUMBER = re.compile(r"^" + CHECKPOINT_NAME + r"-(\d+)$")


@dataclasses.dataclass
class ResumeInfo:
    """What `restore` brought back.

    Attributes:
      path: the checkpoint prefix restored.
      step: the mechanism's step counter (steps trained).
      position: where in the batch stream to continue (`rest_of_epoch`).
      ledger: the restored `PrivacyLedger` (None if the run kept none).
      owes_noise: True when a lazy mechanism restored un-flushed rows.
      manifest: the manifest dict.
    """

    path: str
    step: int
    position: DataPosition
    ledger: PrivacyLedger | None
    owes_noise: bool
    manifest: dict


class _TrainingState(tf.Module):
    """Model, optimizer and mechanism under one name: un-flushed training state, not a release."""

    def __init__(self, dp_model):
        super().__init__(name="training_state")
        self.model = dp_model.inner
        self.optimizer = dp_model.optimizer
        self.mechanism = dp_model.mechanism


class _Progress(tf.Module):
    """The ledger (JSON) and the position in the batch stream, saved with the weights."""

    def __init__(self):
        super().__init__(name="progress")
        self.ledger_json = tf.Variable("", dtype=tf.string, trainable=False, name="ledger_json")
        self.batches_consumed = tf.Variable(0, dtype=tf.int64, trainable=False, name="batches_consumed")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.batch_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="batch_in_epoch")


class TrainingCheckpoint:
    """Saves and restores a `DPModel`'s complete training state in `directory`.

    Args:
      directory: where checkpoints and their manifests go (created).
      dp_model: the compiled `DPModel`.
      budget: the run's `PrivacyBudget`; its ledger is checkpointed and, on
        restore, loaded back into it (`PrivacyBudget.resume_from`).
      ledger: a `PrivacyLedger` to checkpoint instead, when there is no budget.
      max_to_keep: complete checkpoints kept (older ones are deleted).
      batches_per_epoch: B of the batch stream (needed to resume mid-epoch).
      sampler_seed: the batch sampler's seed (recorded; a resume with another
        seed is refused).

    Raises:
      TypeError, ValueError: bad arguments.
    """

    def __init__(
        self,
        directory: str,
        *,
        dp_model,
        budget=None,
        ledger: PrivacyLedger | None = None,
        max_to_keep: int = 3,
        batches_per_epoch: int | None = None,
        sampler_seed: int | None = None,
    ):
        _check_arguments(dp_model, budget, ledger, max_to_keep, batches_per_epoch, sampler_seed)
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.dp_model = dp_model
        self.budget = budget
        self._ledger = ledger
        self.batches_per_epoch = batches_per_epoch
        self.sampler_seed = sampler_seed
        self._adopted = False  # True once this run restored from, or started, the directory
        self._progress = _Progress()
        self._root = tf.train.Checkpoint(training_state=_TrainingState(dp_model), progress=self._progress)
        self._manager = tf.train.CheckpointManager(
            self._root, self.directory, max_to_keep=max_to_keep, checkpoint_name=CHECKPOINT_NAME
        )

    # -- accessors ----------------------------------------------------------------
    @property
    def ledger(self) -> PrivacyLedger | None:
        """The ledger that is checkpointed (the budget's, if any)."""
        return self.budget.ledger if self.budget is not None else self._ledger

    def complete_checkpoints(self) -> list[str]:
        """Prefixes of checkpoints that have a manifest, oldest first."""
        found = []
        for path in glob.glob(os.path.join(glob.escape(self.directory), "*" + manifest_lib.MANIFEST_SUFFIX)):
            prefix = path[: -len(manifest_lib.MANIFEST_SUFFIX)]
            match = _NUMBER.match(os.path.basename(prefix))
            if match:
                found.append((int(match.group(1)), prefix))
        return [prefix for _, prefix in sorted(found)]

    # -- saving -------------------------------------------------------------------
    def save(self, *, position: DataPosition) -> str:
        """Writes a checkpoint of the current state and its manifest; returns the prefix.

        Raises:
          CheckpointError: the ledger disagrees with the mechanism's step count
            (a step would be accounted twice or not at all after a resume), or
            the directory holds another run's checkpoints and this run neither
            restored from it nor started it (its higher-numbered checkpoints
            would later be taken for this run's).
        """
        if not self._adopted and self.complete_checkpoints():
            raise CheckpointError(
                f"{self.directory} holds checkpoints of an earlier run ({os.path.basename(self.complete_checkpoints()[-1])} "
                "the newest); call `restore_or_initialize()` first to continue it, or use a new directory."
            )
        step, ledger = self._step_accounted_for(), self.ledger
        self._progress.ledger_json.assign("" if ledger is None else ledger.to_json(indent=None))
        self._progress.batches_consumed.assign(position.batches_consumed)
        self._progress.epoch.assign(position.epoch)
        self._progress.batch_in_epoch.assign(position.batch_in_epoch)
        # A manifest left by an earlier checkpoint with this number (e.g. after restoring an
        # older one) must not vouch for the files about to be written.
        stale = manifest_lib.manifest_path(os.path.join(self.directory, f"{CHECKPOINT_NAME}-{step}"))
        if os.path.exists(stale):
            os.remove(stale)
        # Training state, not a release: the table is saved un-flushed, with the history of
        # what each row owes (LazyDP's read guard would otherwise flush it first).
        with read_guard.unguarded():
            prefix = self._manager.save(checkpoint_number=step)
        manifest_lib.write_manifest(prefix, self._manifest(prefix, step, position, ledger))
        self._adopted = True
        self._remove_stale_manifests()
        return prefix

    def _step_accounted_for(self) -> int:
        """The step to save (the mechanism's, or the optimizer's without clipping), checked against the ledger."""
        mechanism = self.dp_model.mechanism
        step = (
            int(mechanism.steps.numpy())
            if mechanism.clips_per_example
            else int(self.dp_model.optimizer.iterations.numpy())
        )
        ledger = self.ledger
        if ledger is not None and mechanism.clips_per_example and ledger.steps != step:
            raise CheckpointError(
                f"Refusing to checkpoint: the ledger holds {ledger.steps} steps but mechanism "
                f"{mechanism.name!r} has taken {step}; after a resume a step would be accounted twice or "
                "not at all. Record every step in the ledger (PrivacyBudget does) before saving."
            )
        return step

    def _manifest(self, prefix: str, step: int, position: DataPosition, ledger: PrivacyLedger | None) -> dict:
        """What wrote checkpoint `prefix`, its files' checksums and where the run stands."""
        owes = bool(self.dp_model.mechanism.owes_noise())
        return {
            "checkpoint": os.path.basename(prefix),
            "signature": self._signature(),
            "files": manifest_lib.describe_files(prefix),
            "progress": {
                "step": step,
                "position": position.to_json(),
                "ledger_steps": None if ledger is None else ledger.steps,
                "owes_noise": owes,
            },
            "release": (
                "NOT releasable: training state of a lazy mechanism that still owes noise; restore it and "
                "export with tfdp_embed.release.export_saved_model (which flushes)."
                if owes
                else "training state; export with tfdp_embed.release.export_saved_model"
            ),
            "library_version": __version__,
            "tensorflow_version": manifest_lib.tensorflow_version(),
        }

    def _remove_stale_manifests(self) -> None:
        """Deletes manifests whose checkpoint the manager rotated away."""
        for prefix in self.complete_checkpoints():
            if not os.path.exists(prefix + ".index") and prefix not in self._manager.checkpoints:
                os.remove(manifest_lib.manifest_path(prefix))

    def _signature(self) -> dict:
        return manifest_lib.describe_training_state(
            self.dp_model, budget=self.budget, batches_per_epoch=self.batches_per_epoch, sampler_seed=self.sampler_seed
        )

    # -- restoring ----------------------------------------------------------------
    def restore_or_initialize(self, data=None) -> ResumeInfo | None:
        """Restores the newest complete checkpoint; None (nothing touched) when there is none.

        Checkpoint files without a manifest (the writer died before finishing)
        are logged and ignored; TensorFlow's `checkpoint` state file is not
        needed (a garbled one is ignored too).

        Args:
          data: a `tf.data.Dataset` of batches, used only to build an unbuilt
            model (`DPModel.prepare` reads its first batch). Do not pass the
            seeded Poisson sampler you will continue with `rest_of_epoch`:
            a partial read of it (with `with_lookahead`, tf.data prefetches)
            advances its seed stream by a timing-dependent number of batches.

        Raises:
          CheckpointCorruptedError, CheckpointMismatchError: see `restore`.
        """
        self._log_incomplete()
        if not self.complete_checkpoints():
            self._adopted = True
            return None
        return self.restore(data=data)

    def restore(self, prefix: str | None = None, *, data=None) -> ResumeInfo:
        """Restores checkpoint `prefix` (default: the newest complete one), all of it or nothing.

        Raises:
          CheckpointError: no complete checkpoint in the directory.
          CheckpointCorruptedError: unreadable manifest, missing/truncated/
            garbled files (checked against the manifest before loading).
          CheckpointMismatchError: another model shape, optimizer, mechanism,
            hyperparameters, accounting or data setup (before loading).
        """
        if prefix is None:
            complete = self.complete_checkpoints()
            if not complete:
                raise CheckpointError(f"No complete checkpoint (one with a manifest) in {self.directory}.")
            prefix = complete[-1]
        manifest = manifest_lib.read_manifest(manifest_lib.manifest_path(prefix))
        self.dp_model.prepare(data)
        slots = ("optimizer", "variables")  # compared once the optimizer has created its slots
        self._refuse_if_different(prefix, manifest, skip=slots)
        broken = manifest_lib.file_problems(prefix, manifest["files"])
        if broken:
            older = [p for p in self.complete_checkpoints() if p != prefix]
            raise CheckpointCorruptedError(
                f"Checkpoint {prefix} is corrupted; nothing was loaded:\n  - "
                + "\n  - ".join(broken)
                + (f"\nOlder complete checkpoints: {older} (restore one with `restore(prefix)`)." if older else "")
            )
        optimizer = self.dp_model.optimizer
        iterations_before = int(optimizer.iterations.numpy())
        _create_optimizer_variables(self.dp_model)
        try:
            self._refuse_if_different(prefix, manifest, only=slots)
        except CheckpointError:
            optimizer.iterations.assign(iterations_before)  # undo the slot-creating zero step
            raise
        # Training state: restored as saved and left un-flushed (a LazyDP flushes when a checkpoint
        # outside `unguarded()` lists it, see LazyDP._trackable_children).
        with read_guard.unguarded():
            status = self._root.restore(prefix)
            try:
                status.assert_consumed()
            except AssertionError as error:  # the manifest matched, so this means a library bug
                raise CheckpointMismatchError(
                    f"Checkpoint {prefix} held values no variable of this run took ({error}); training state "
                    "is inconsistent, do not continue from it."
                ) from None
        _rekey(self.dp_model)
        self._adopted = True
        return self._resume_info(prefix, manifest)

    def _refuse_if_different(self, prefix: str, manifest: dict, **which) -> None:
        problems = manifest_lib.signature_differences(manifest["signature"], self._signature(), **which)
        if problems:
            raise CheckpointMismatchError(
                f"Checkpoint {prefix} was written by a different training setup; nothing was loaded. "
                "Differences:\n  - " + "\n  - ".join(problems) + "\nResume with the same model, optimizer, "
                "mechanism and hyperparameters, or start in a new directory."
            )

    def _resume_info(self, prefix: str, manifest: dict) -> ResumeInfo:
        mechanism = self.dp_model.mechanism
        text = self._progress.ledger_json.numpy().decode()
        ledger = PrivacyLedger.from_json(text) if text else None
        step = int(manifest["progress"]["step"])
        if ledger is not None:
            if self.budget is not None:
                self.budget.resume_from(ledger)
            elif self._ledger is not None:
                self._ledger.resume_from(ledger)
        elif self.ledger is not None and mechanism.clips_per_example and step > 0:
            raise CheckpointMismatchError(
                f"Checkpoint {prefix} holds no privacy ledger but this run accounts with one; its {step} "
                "steps would go unaccounted. Restore it without a budget and account for them explicitly "
                "(PrivacyBudget(initial_steps=...))."
            )
        saved = manifest["progress"]["position"]
        position = normalized_position(
            batches_consumed=int(self._progress.batches_consumed.numpy()),
            epoch=int(self._progress.epoch.numpy()),
            batch_in_epoch=int(self._progress.batch_in_epoch.numpy()),
            batches_per_epoch=saved.get("batches_per_epoch") or self.batches_per_epoch,
        )
        owes = bool(mechanism.owes_noise())
        _LOG.info(
            "Restored %s: step %d, epoch %d, batch %d of the epoch, ledger %s%s.",
            prefix,
            step,
            position.epoch,
            position.batch_in_epoch,
            "none" if ledger is None else f"{ledger.steps} steps",
            ", un-flushed lazy state (owes noise; export flushes)" if owes else "",
        )
        return ResumeInfo(prefix, step, position, ledger, owes, manifest)

    def _log_incomplete(self) -> None:
        """Logs checkpoint files without a manifest (a run stopped while writing them): never used."""
        complete = {os.path.basename(p) for p in self.complete_checkpoints()}
        for index in glob.glob(os.path.join(glob.escape(self.directory), CHECKPOINT_NAME + "-*.index")):
            name = os.path.basename(index)[: -len(".index")]
            if name not in complete:
                _LOG.warning(
                    "Ignoring incomplete checkpoint %s in %s (no manifest: the writing run stopped before it "
                    "finished).",
                    name,
                    self.directory,
                )


def _create_optimizer_variables(dp) -> None:
    """Creates the optimizer's slots with one zero-gradient step (restore overwrites all it touches).

    A fresh optimizer creates its slots at its first step; restoring before
    that would leave them to TensorFlow's deferred restoration, i.e. load
    part of the checkpoint now and part later. It runs only after the
    model, mechanism, optimizer config and files were checked. SGD (with
    momentum), Adam, Adagrad and RMSprop leave every weight unchanged on a
    zero gradient; whatever it changes (the iteration counter, fresh
    slots; an FTRL optimizer's weights) is overwritten by the restore.
    """
    create = getattr(dp, "create_optimizer_variables", None)
    if create is not None:  # a front end that builds its optimizer's slots itself (Keras 3)
        create()
        return
    tables = {layer.embeddings.ref(): layer for layer in submodules(dp.inner) if isinstance(layer, EmbeddingLookup)}
    pairs = []
    for variable in dp.inner.trainable_variables:
        layer = tables.get(tf_variable(variable).ref())
        if layer is not None:  # an empty sparse gradient: no [vocab, dim] tensor
            grad = tf.IndexedSlices(
                tf.zeros([0, layer.output_dim], variable.dtype),
                tf.zeros([0], tf.int64),
                tf.shape(variable, out_type=tf.int64),
            )
        else:
            grad = tf.zeros_like(variable)
        pairs.append((grad, variable))
    dp.optimizer.apply_gradients(pairs)


def _check_arguments(dp_model, budget, ledger, max_to_keep, batches_per_epoch, sampler_seed) -> None:
    """Refuses what `TrainingCheckpoint` cannot work with, naming the argument."""
    from tfdp_embed.accounting.budget import BudgetTracker

    if not all(hasattr(dp_model, name) for name in ("inner", "mechanism", "prepare")):
        raise TypeError(f"`dp_model` must be a tfdp_embed DPModel; received {type(dp_model).__name__}.")
    if getattr(dp_model, "optimizer", None) is None:
        raise ValueError("`dp_model` must be compiled (it needs its optimizer) before checkpointing.")
    if budget is not None and not isinstance(budget, BudgetTracker):
        raise TypeError(f"`budget` must be a PrivacyBudget or None; received {type(budget).__name__}.")
    if budget is not None and ledger is not None:
        raise ValueError("Pass `budget` (its ledger is checkpointed) or `ledger`, not both.")
    if ledger is not None and not isinstance(ledger, PrivacyLedger):
        raise TypeError(f"`ledger` must be a PrivacyLedger or None; received {type(ledger).__name__}.")
    if budget is not None and budget.mechanism is not dp_model.mechanism:
        raise ValueError("`budget` accounts for another mechanism than `dp_model.mechanism`.")
    for name, value in (("max_to_keep", max_to_keep), ("batches_per_epoch", batches_per_epoch)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(
                f"`{name}` must be an int >= 1{' or None' if name != 'max_to_keep' else ''}; received {value!r}."
            )
    if sampler_seed is not None and (isinstance(sampler_seed, bool) or not isinstance(sampler_seed, int)):
        raise TypeError(f"`sampler_seed` must be an int or None; received {sampler_seed!r}.")


def _rekey(dp_model) -> None:
    """Re-keys the restored mechanism's RNGs from OS entropy (seed=None), then re-syncs workers.

    An unseeded run's checkpoint holds no noise-generator state (nor
    LazyDP's catch-up stream); re-keying after the restore makes sure that
    two runs restored from one checkpoint never draw the same noise, whose
    models would differ by their exact, noise-free gradient difference. An explicit seed keeps the restored state (a resumed test
    run reproduces the uninterrupted one). Under MultiWorkerMirroredStrategy
    every worker re-keys, then takes worker 0's new state, so the workers
    still draw the same noise.
    """
    mechanism = dp_model.mechanism
    if mechanism.rekey_from_entropy():
        synchronize = getattr(dp_model, "synchronize_noise", None)  # tf-keras: workers take worker 0's state
        if synchronize is not None:
            synchronize()
        _LOG.info(
            "Restored mechanism %r re-keyed from OS entropy: no noise of the saved run is replayed.", mechanism.name
        )


__all__ = ["CHECKPOINT_NAME", "ResumeInfo", "TrainingCheckpoint"]
