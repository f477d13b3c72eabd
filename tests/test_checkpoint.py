"""Checkpoint / resume of DP training (tfdp_embed/keras2/checkpointing/).

THE test kills a training process with SIGKILL mid-epoch, resumes it in a new
process and compares with an uninterrupted run (tests/checkpoint_worker.py):
final epsilon, steps accounted, ledger entries, noise generator state and
weights (LazyDP and dense DP-SGD). The other tests run in-process on the
same tiny model: corrupted, incomplete and mismatched checkpoints are refused
before anything is loaded; a LazyDP checkpoint is un-flushed training state
that only export (with a flush) releases; the batch stream continues.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import checkpoint_worker as worker
import numpy as np
import pytest

from tfdp_embed import keras, tf
from tfdp_embed.accounting import PrivacyLedger
from tfdp_embed.checkpointing.position import normalized_position
from tfdp_embed.keras2.checkpointing import (
    CheckpointCorruptedError,
    CheckpointError,
    CheckpointMismatchError,
    DPCheckpoint,
    rest_of_epoch,
)
from tfdp_embed.keras2.export import export_saved_model

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint_worker.py")
ROOT = os.path.dirname(os.path.dirname(WORKER))


# -- THE test: SIGKILL mid-epoch, resume, compare with the uninterrupted run --------------


def _start(mode, mechanisms, directory, out):
    cmd = [
        sys.executable,
        WORKER,
        mode,
        "--mechanisms",
        mechanisms,
        "--directory",
        str(directory),
    ]
    if out is not None:
        cmd += ["--out", str(out)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)  # this tree's tfdp_embed
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(process, what, timeout=240):
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"{what} failed ({process.returncode}):\n{output[-3000:]}"


def test_sigkill_mid_epoch_then_resume_equals_uninterrupted_run(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    full = _start("full", "lazy,dense", tmp_path / "unused", out)
    crashes = {name: _start("crash", name, tmp_path / "ckpt", None) for name in ("lazy", "dense")}
    for name, process in crashes.items():
        hung = tmp_path / "ckpt" / name / "hung"
        deadline = time.monotonic() + 240
        while not hung.exists():  # poll: the worker is past step 65, checkpoints 7..63 exist
            assert process.poll() is None, f"crash worker {name} exited early:\n{process.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, f"crash worker {name} never reached its hang point"
            time.sleep(0.05)
        assert (tmp_path / "ckpt" / name / "ckpt-63.manifest.json").exists()
        os.kill(process.pid, signal.SIGKILL)
        process.communicate(timeout=60)
        assert process.returncode == -signal.SIGKILL
    resume = _start("resume", "lazy,dense", tmp_path / "ckpt", out)
    _finish(full, "uninterrupted run")
    _finish(resume, "resumed run")

    for name in ("lazy", "dense"):
        a, b = np.load(out / f"full_{name}.npz"), np.load(out / f"resume_{name}.npz")
        extra = json.loads(str(b["extra"]))
        # Resumed from the last complete checkpoint, ckpt-63, mid-epoch (epoch 1, batch 23
        # of 40); the two steps trained after it (64, 65) died with the killed process.
        per_epoch = round(1 / worker.Q)
        restored = (
            extra["restored_step"],
            extra["restored_epoch"],
            extra["restored_batch_in_epoch"],
        )
        assert restored == (63, 63 // per_epoch, 63 % per_epoch) and 63 % per_epoch != 0
        assert extra["restored_ledger_steps"] == 63
        assert extra["restored_owes_noise"] == (name == "lazy")
        # Every step accounted once: 200 = 5 epochs x 40 batches, in one ledger entry.
        total = worker.EPOCHS * per_epoch
        assert int(a["steps"]) == int(b["steps"]) == int(b["iterations"]) == total
        ledger_a, ledger_b = (
            PrivacyLedger.from_json(str(a["ledger"])),
            PrivacyLedger.from_json(str(b["ledger"])),
        )
        assert ledger_a == ledger_b and ledger_b.steps == total and len(ledger_b) == 1
        assert float(a["epsilon"]) == float(b["epsilon"])
        # The noise RNG continued (a restarted one would end 63 steps of draws behind) ...
        np.testing.assert_array_equal(a["generator_state"], b["generator_state"])
        # ... so the resumed run drew exactly the uninterrupted run's noise: same weights,
        # raw (LazyDP: un-flushed) and after the flush export performs.
        for key in [k for k in a.files if k.startswith(("raw_", "flushed_"))]:
            np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-6, err_msg=f"{name} {key}")


# -- in-process helpers ------------------------------------------------------------------


def _variables(dp):
    """Every variable a checkpoint holds (model, optimizer, mechanism, noise RNG)."""
    # Creation order (and the name scope of `iterations`) varies with what created them first.
    optimizer = sorted(dp.optimizer.variables(), key=lambda v: v.name.removeprefix("SGD/"))
    variables = list(dp.inner.weights) + optimizer + list(dp.mechanism.variables)
    return variables + [dp.mechanism.generator.state]


def _state(dp):
    """(variables, their values now)."""
    variables = _variables(dp)
    return variables, [v.numpy().copy() for v in variables]


def _assert_same_state(before, after):
    """`after` (a DPModel or state) holds the values of `before` in the same variables."""
    if not isinstance(after, tuple):
        after = _state(after)
    assert len(before[1]) == len(after[1])
    for x, y in zip(before[1], after[1]):
        np.testing.assert_array_equal(x, y)


def _assert_untouched(before):
    """Every variable in `before` still holds its value (new, fresh optimizer slots aside)."""
    for variable, value in zip(*before):
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.name)


def _train(directory, mechanism="lazy", steps=12, every=5):
    """Trains `steps` steps with checkpoints every `every`; returns (dp, budget, checkpoint)."""
    dp, batches, budget, wrap, info = worker.build(mechanism)
    ckpt = DPCheckpoint(
        str(directory),
        dp_model=dp,
        budget=budget,
        every_n_steps=every,
        batches_per_epoch=info.batches_per_epoch,
        sampler_seed=worker.SAMPLER_SEED,
    )

    class StopAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(dp.mechanism.steps.numpy()) >= steps:
                self.model.stop_training = True

    dp.fit(wrap(batches), epochs=3, callbacks=[budget, ckpt, StopAt()], verbose=0)
    return dp, budget, ckpt


@pytest.fixture(scope="module")
def trained_lazy(tmp_path_factory):
    """A LazyDP run stopped at step 12: checkpoints ckpt-5, ckpt-10 and ckpt-12 (train end)."""
    directory = tmp_path_factory.mktemp("lazy_ckpt")
    dp, _, _ = _train(directory)
    return directory, dp


def _fresh(directory, mechanism="lazy", **kwargs):
    dp, batches, budget, _, info = worker.build(mechanism, **kwargs)
    ckpt = DPCheckpoint(
        str(directory),
        dp_model=dp,
        budget=budget,
        every_n_steps=5,
        batches_per_epoch=info.batches_per_epoch,
        sampler_seed=worker.SAMPLER_SEED,
    )
    return dp, budget, ckpt, batches


def _copy(directory, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(directory, target)
    return target


# -- what is saved and restored ----------------------------------------------------------------


def test_restore_brings_back_every_variable_and_the_ledger(trained_lazy, tmp_path):
    directory, trained = trained_lazy
    dp, budget, ckpt, _ = _fresh(_copy(directory, tmp_path))
    info = ckpt.restore_or_initialize()
    assert info.step == 12 and os.path.basename(info.path) == "ckpt-12"
    assert (
        info.position.epoch,
        info.position.batch_in_epoch,
        info.position.batches_consumed,
    ) == (0, 12, 12)
    _assert_same_state(_state(trained), dp)
    assert budget.ledger.steps == 12 and budget.ledger == info.ledger


def test_no_checkpoint_means_initialize_and_nothing_touched(tmp_path):
    dp, _, ckpt, _ = _fresh(tmp_path / "empty")
    before = _state(dp)
    assert ckpt.restore_or_initialize() is None
    _assert_same_state(before, dp)
    assert int(dp.optimizer.iterations.numpy()) == 0


def test_lazy_checkpoint_is_unflushed_training_state_never_the_model(trained_lazy, tmp_path):
    directory, trained = trained_lazy
    directory = _copy(directory, tmp_path)
    manifest = json.loads((directory / "ckpt-12.manifest.json").read_text())
    assert manifest["progress"]["owes_noise"] is True and "NOT releasable" in manifest["release"]
    # A plain Keras load finds no model at the checkpoint's root: it refuses, nothing loaded.
    plain = worker.build("lazy")[0].inner
    table = plain.get_layer("emb").embeddings.numpy().copy()
    with pytest.raises(AssertionError, match="Nothing except the root object matched"):
        plain.load_weights(str(directory / "ckpt-12"))
    np.testing.assert_array_equal(plain.get_layer("emb").embeddings.numpy(), table)
    # Restoring re-attaches table and history: the restored mechanism owes the same noise.
    dp, _, ckpt, _ = _fresh(directory)
    info = ckpt.restore_or_initialize()
    assert info.owes_noise and dp.mechanism.owes_noise()
    # Export flushes it: the released table is the flushed one, equal to flushing the original.
    export_saved_model(dp, str(tmp_path / "export"))
    assert not dp.mechanism.owes_noise()
    trained.flush()
    np.testing.assert_array_equal(
        dp.inner.get_layer("emb").embeddings.numpy(),
        trained.inner.get_layer("emb").embeddings.numpy(),
    )
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    exported = [v.numpy() for v in loaded.variables if v.shape == (worker.VOCAB, worker.DIM)]
    np.testing.assert_array_equal(exported[0], dp.inner.get_layer("emb").embeddings.numpy())


# -- refused checkpoints: nothing is loaded ---------------------------------------------------------


def _corrupt_truncate(directory):
    data = next(directory.glob("ckpt-12.data-*"))
    data.write_bytes(data.read_bytes()[:-100])


def _corrupt_garble(directory):
    data = next(directory.glob("ckpt-12.data-*"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))


def _corrupt_missing_index(directory):
    (directory / "ckpt-12.index").unlink()


def _corrupt_manifest(directory):
    path = directory / "ckpt-12.manifest.json"
    path.write_text(path.read_text()[:50])


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (_corrupt_truncate, "truncated"),
        (_corrupt_garble, "garbled"),
        (_corrupt_missing_index, "ckpt-12.index is missing"),
        (_corrupt_manifest, "cannot be read"),
    ],
)
def test_corrupted_checkpoint_is_refused_before_loading(trained_lazy, tmp_path, corrupt, message):
    directory = _copy(trained_lazy[0], tmp_path)
    corrupt(directory)
    dp, budget, ckpt, _ = _fresh(directory)
    dp.prepare(None)
    before = _state(dp)
    with pytest.raises(CheckpointCorruptedError, match=message) as error:
        ckpt.restore_or_initialize()
    assert "nothing was loaded" in str(error.value)
    _assert_untouched(before)
    assert budget.ledger.steps == 0 and int(dp.optimizer.iterations.numpy()) == 0


def test_incomplete_checkpoint_without_manifest_is_never_picked_up(trained_lazy, tmp_path, caplog):
    directory = _copy(trained_lazy[0], tmp_path)
    os.remove(directory / "ckpt-12.manifest.json")  # the writer was killed before the manifest
    (directory / "checkpoint").write_text("garbled {{")  # TensorFlow's state file is not needed
    _, budget, ckpt, _ = _fresh(directory)
    with caplog.at_level("WARNING"):
        info = ckpt.restore_or_initialize()
    assert os.path.basename(info.path) == "ckpt-10" and info.step == 10 and budget.ledger.steps == 10
    assert "Ignoring incomplete checkpoint ckpt-12" in caplog.text


@pytest.mark.parametrize(
    "kwargs, difference",
    [
        ({"vocab": worker.VOCAB + 1}, "model.variables"),
        ({"mechanism": "dense"}, "mechanism.class"),
        ({"noise_multiplier": 2.0}, "mechanism.hyperparameters"),
        ({"sampling_probability": 0.1}, "accounting.sampling_probability"),
        ({"optimizer": "adam"}, "optimizer.class"),
    ],
)
def test_mismatched_checkpoint_is_refused_before_loading(trained_lazy, tmp_path, kwargs, difference):
    directory = _copy(trained_lazy[0], tmp_path)
    kwargs = dict(kwargs)
    mechanism = kwargs.pop("mechanism", "lazy")
    optimizer = kwargs.pop("optimizer", None)
    dp, _, ckpt, _ = _fresh(directory, mechanism, **kwargs)
    if optimizer == "adam":  # the same model compiled with another optimizer
        dp.compile(
            optimizer=keras.optimizers.legacy.Adam(0.01),
            loss=keras.losses.BinaryCrossentropy(from_logits=True),
        )
    dp.prepare(None)
    before = _state(dp)
    with pytest.raises(CheckpointMismatchError, match="nothing was loaded") as error:
        ckpt.restore_or_initialize()
    assert difference in str(error.value)
    _assert_untouched(before)
    assert int(dp.optimizer.iterations.numpy()) == 0


def test_a_new_run_does_not_mix_its_checkpoints_with_an_earlier_runs(trained_lazy, tmp_path):
    directory = _copy(trained_lazy[0], tmp_path)
    _, _, ckpt, _ = _fresh(directory)  # forgot restore_or_initialize()
    with pytest.raises(
        CheckpointError,
        match="earlier run .ckpt-12 the newest.; call `restore_or_initialize",
    ):
        ckpt.save()


def test_save_refuses_a_ledger_that_lags_the_mechanism(tmp_path):
    dp, batches, _, _, _ = worker.build("dense")
    ckpt = DPCheckpoint(str(tmp_path), dp_model=dp, ledger=PrivacyLedger(), every_n_steps=2)
    with pytest.raises(CheckpointError, match="ledger holds 0 steps but mechanism 'dense' has taken 2"):
        dp.fit(batches.take(3), epochs=1, callbacks=[ckpt], verbose=0)


def test_bad_arguments_are_rejected(tmp_path):
    dp = worker.build("dense")[0]
    with pytest.raises(ValueError, match="every_n_steps"):
        DPCheckpoint(str(tmp_path), dp_model=dp, every_n_steps=0)
    with pytest.raises(TypeError, match="DPModel"):
        DPCheckpoint(str(tmp_path), dp_model=dp.inner)
    with pytest.raises(ValueError, match="batches_per_epoch"):
        DPCheckpoint(str(tmp_path), dp_model=dp, batches_per_epoch=-1)


# -- the batch stream continues --------------------------------------------------------------------


def test_rest_of_epoch_continues_the_poisson_stream():
    def stream(batches, epochs):
        return [x[0].numpy().tolist() for _ in range(epochs) for x in batches]

    per_epoch = round(1 / worker.Q)
    uninterrupted = stream(worker.build("dense")[1], 3)
    batches = worker.build("dense")[1]  # the same sampler, rebuilt in a "new process"
    consumed = per_epoch + 7  # killed after batch 7 of epoch 1
    position = normalized_position(
        batches_consumed=consumed,
        epoch=1,
        batch_in_epoch=7,
        batches_per_epoch=per_epoch,
    )
    rest = [x[0].numpy().tolist() for x in rest_of_epoch(batches, position)]
    assert len(rest) == per_epoch - 7
    assert rest + stream(batches, 1) == uninterrupted[consumed:]  # no batch replayed or skipped
    at_boundary = normalized_position(
        batches_consumed=per_epoch,
        epoch=0,
        batch_in_epoch=per_epoch,
        batches_per_epoch=per_epoch,
    )
    assert (at_boundary.epoch, at_boundary.batch_in_epoch) == (1, 0)
    assert rest_of_epoch(batches, at_boundary) is None
    with pytest.raises(ValueError, match="batches per epoch"):
        rest_of_epoch(batches.take(5), position)


# -- other mechanisms' state; the budget across a resume ---------------------------------------------


@pytest.mark.parametrize("mechanism", ["fest", "adafest", "eana"])
def test_selection_and_counter_state_round_trips(tmp_path, mechanism):
    trained, _, ckpt = _train(tmp_path, mechanism, steps=6, every=3)
    assert os.path.basename(ckpt.last_saved) == "ckpt-6"
    dp, budget, fresh, _ = _fresh(tmp_path, mechanism)
    fresh.restore_or_initialize()
    _assert_same_state(_state(trained), dp)  # DP-FEST rows/positions, AdaFEST counters, RNG
    # DP-FEST's selection (a one-off event) is in the restored ledger once, not again.
    kinds = [e.kind for e in budget.ledger.entries]
    assert kinds == (["setup", "step"] if mechanism == "fest" else ["step"])
    budget.on_train_begin()
    assert [e.kind for e in budget.ledger.entries] == kinds and budget.ledger.steps == 6
    if mechanism == "eana":  # not DP: its ledger keeps dp_accounting's UnsupportedDpEvent
        assert budget.ledger.entries[0].event == dp.mechanism.step_event(worker.Q)
        assert budget.log_key == "epsilon_not_dp"


def test_resumed_run_with_nearly_spent_budget_stops_at_the_uninterrupted_step(tmp_path):
    import dp_accounting

    from tfdp_embed.accounting import compute_epsilon

    step = dp_accounting.PoissonSampledDpEvent(worker.Q, dp_accounting.GaussianDpEvent(1.0))

    def eps(k):
        return compute_epsilon(
            [dp_accounting.SelfComposedDpEvent(step, k)],
            target_delta=worker.DELTA,
            accountant="rdp",
        )

    allowed = 21  # the target sits between eps(21) and eps(22): exactly 21 steps fit
    target = 0.5 * (eps(allowed) + eps(allowed + 1))
    _train(tmp_path, "dense", steps=12, every=4)  # interrupted after 12 steps (ckpt-12)
    dp, batches, budget, _, info = worker.build("dense", target_epsilon=target)
    budget.report_path, budget.dataset_size = str(tmp_path / "report.json"), worker.N
    ckpt = DPCheckpoint(
        str(tmp_path),
        dp_model=dp,
        budget=budget,
        every_n_steps=4,
        batches_per_epoch=info.batches_per_epoch,
        sampler_seed=worker.SAMPLER_SEED,
    )
    position = ckpt.restore_or_initialize().position
    dp.fit(rest_of_epoch(batches, position), epochs=1, callbacks=[budget, ckpt], verbose=0)
    # Stopped after 9 more steps, at step 21: the step that would exceed the target never ran.
    assert int(dp.mechanism.steps.numpy()) == budget.ledger.steps == allowed
    assert budget.stopped_by_budget and budget.max_steps == allowed
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps"] == allowed and report["extra"]["budget"]["stopped_by_budget"] is True
    assert report["epsilon"] == pytest.approx(eps(allowed), rel=1e-9) and report["epsilon"] <= target
    assert os.path.basename(ckpt.last_saved) == f"ckpt-{allowed}"  # the final state is checkpointed
