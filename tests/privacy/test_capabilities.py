"""Attack: get a capability by name or by default instead of declaring it (issue 16, leak 7).

Support used to be looked up by `mechanism.name`, and a name missing from
the table ran under MirroredStrategy: `class MyLazy(LazyDP): name =
"my_lazy"` would have run LazyDP's read hook (owed noise added inside each
replica's forward pass) on every replica. Now a class declares its
capabilities (`MechanismCapabilities`, inherited); anything undeclared is
refused, and a copied name buys nothing.

The undeclared one-off event runs for both front ends (the `fe` fixture of
tests/conftest.py: each front end's `PrivacyBudget`); strategies, the TPU
plan and lookahead are tf-keras's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dp_accounting
import numpy as np
import pytest

from tfdp_embed.accounting import privacy_report
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2 import distribute
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import EANA, DenseDPSGD, NoiseMechanism

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def mirrored():
    """Construction of each case's DPModel under MirroredStrategy on 2 logical CPUs (subprocess)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(HERE / "mirrored_capability_cases.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-3000:]
    result = json.loads(lines[-1])
    assert result["replicas"] == 2
    return result


def test_renamed_lazy_subclass_is_refused_under_mirrored(mirrored):
    case = mirrored["my_lazy"]
    assert case["refused"], "MyLazy(LazyDP) with a new name was accepted under MirroredStrategy"
    assert case["type"] == "DistributionNotSupportedError"
    # Names the class, what it lacks, where its declaration came from and how to declare.
    for part in ("MyLazy", "MirroredStrategy", "inherited from LazyDP", "MechanismCapabilities", "read hook"):
        assert part in case["error"], part


def test_brand_new_mechanism_is_refused_under_mirrored(mirrored):
    case = mirrored["brand_new"]
    assert case["refused"], "a NoiseMechanism subclass that declares nothing was accepted under MirroredStrategy"
    assert "BrandNew" in case["error"] and "one device only" in case["error"]


def test_copying_a_name_does_not_copy_capabilities(mirrored):
    case = mirrored["spoofs_dense"]
    assert case["refused"], "a mechanism named 'dense' got dense DP-SGD's MirroredStrategy support"
    assert "SpoofsDense" in case["error"]
    assert not mirrored["dense"]["refused"]  # the real one declares it


class _Quiet(NoiseMechanism):
    """A new mechanism with no declarations."""

    name = "eana"  # a copied name: gets neither EANA's strategies nor its TPU plan

    def update(self, clipped):
        return self._dense_noised(clipped, self.noise_multiplier)

    def step_event(self, sampling_probability):
        return dp_accounting.PoissonSampledDpEvent(sampling_probability, dp_accounting.GaussianDpEvent(1.0))


class _SecretSetup(_Quiet):
    """Spends a one-off cost it does not declare (e.g. a selection drawn from private data)."""

    name = "secret_setup"

    def setup_event(self):
        return dp_accounting.GaussianDpEvent(0.5)


def _model():
    inputs = keras.Input((2,), dtype="int32")
    return keras.Model(inputs, keras.layers.Dense(1)(DPEmbedding(20, 3, combiner="mean", name="t")(inputs)))


def test_lookahead_needs_a_mechanism_that_declares_it():
    with pytest.raises(ValueError, match="DenseDPSGD .* does not declare lookahead"):
        DPModel(
            _model(),
            mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0),
            expected_batch_size=4,
            lookahead=True,
        )


def test_copied_name_gets_no_tpu_plan():
    assert distribute.tpu_embedding_plan(EANA(l2_norm_clip=1.0, noise_multiplier=1.0)).possible
    with pytest.raises(KeyError, match="_Quiet"):
        distribute.tpu_embedding_plan(_Quiet(l2_norm_clip=1.0, noise_multiplier=1.0))
    assert distribute.unsupported_reason(_Quiet, distribute.MULTI_WORKER_MIRRORED) is not None
    assert distribute.unsupported_reason(_Quiet, distribute.PARAMETER_SERVER) is not None


def test_undeclared_one_off_event_is_refused_by_budget_and_report(fe):
    mechanism = _SecretSetup(l2_norm_clip=1.0, noise_multiplier=1.0)
    with pytest.raises(PrivacyContractError, match="_SecretSetup .* one-off events"):
        privacy_report(
            mechanism=mechanism, delta=1e-5, sampling_probability=0.1, dataset_size=40, steps=3, batching="poisson"
        )
    model = fe.keras.Sequential([fe.keras.Input((4,)), fe.keras.layers.Dense(1)])
    model.compile(optimizer=fe.keras.optimizers.SGD(0.01), loss="mse")
    budget = fe.PrivacyBudget(mechanism, sampling_probability=0.1, target_epsilon=5.0, target_delta=1e-5)
    data = tf.data.Dataset.from_tensor_slices((np.zeros([8, 4], "float32"), np.zeros([8, 1], "float32"))).batch(4)
    with pytest.raises(PrivacyContractError, match="one-off events"):
        model.fit(data, epochs=1, callbacks=[budget], verbose=0)


def test_package_docstring_table_is_the_declarations():
    # The table in tfdp_embed/keras2/distribute/__init__.py, indented as a docstring block.
    assert textwrap.indent(distribute.support_table(), "    ") in distribute.__doc__
