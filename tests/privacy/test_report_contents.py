"""Attack: read statistics of the un-noised training data from the privacy report (issue 16, leak 10).

`privacy_report.json` is written beside every released model, so it must be
a function of hyperparameters and of what the mechanism released, nothing
else. DP-AdaFEST's report held `dropped_touched_fraction` and
`mean_noise_only_rows`, computed from the exact (un-noised) row touches.

The oracle: two neighbouring datasets D and D' = D + one example of
weight 1e-30 that reads two rows nobody else reads (not 0: a weight-0
example is absent, its lookups are not touches; issue 33, N1). With the gradient noise off
(sigma = 0; AdaFEST's contribution noise tiny, so every threshold decision
is certain) and the same seed, every mechanism releases bit-identical
tables for D and D' (checked). A report that is a function of the release
is then identical too; one that counts touched rows is not.

Both front ends (the `fe` fixture of tests/conftest.py).
"""

from __future__ import annotations

import json

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed.accounting import privacy_report
from tfdp_embed.mechanisms import (
    DPFEST,
    EANA,
    DenseDPSGD,
    DPAdaFEST,
    DPAdaFESTPlus,
    LazyDP,
    NonPrivate,
)

VOCAB, DIM, BATCH = 40, 3, 8
# Rows 0-3 are read by two examples each (AdaFEST: noisy count 2/sqrt(2) >= tau = 1, kept),
# rows 4-11 by one (1/sqrt(2) < tau, dropped). The neighbour adds rows 20, 21 with weight 1e-30:
# it touches them, and its gradient (1e-30 x lr / B) is below every table entry's float32 ulp.
IDS = [[0, 1], [0, 1], [2, 3], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
EXTRA = [20, 21]

# Names of statistics of un-noised data that must never be in a report.
DENYLIST = {
    "dropped_touched_fraction",
    "mean_noise_only_rows",
    "noise_only_rows",
    "touched_rows",
    "mean_touched_rows",
    "dropped_touched_rows",
}

ADAFEST = {"contribution_clip": 1.0, "contribution_noise_multiplier": 1e-3, "threshold": 1.0}
MECHANISMS = {
    "dense": lambda: DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=0.0, seed=0),
    "eana": lambda: EANA(l2_norm_clip=1.0, noise_multiplier=0.0, seed=0),
    "lazy": lambda: LazyDP(l2_norm_clip=1.0, noise_multiplier=0.0, seed=0),
    "fest": lambda: DPFEST(
        l2_norm_clip=1.0,
        noise_multiplier=0.0,
        selection_epsilon=1.0,
        top_k=VOCAB,
        counts={"table": np.ones(VOCAB)},
        seed=0,
    ),
    "adafest": lambda: DPAdaFEST(l2_norm_clip=1.0, noise_multiplier=0.0, seed=0, **ADAFEST),
    "adafest+": lambda: DPAdaFESTPlus(
        selected_rows={"table": np.arange(VOCAB)},
        selection_event=dp_accounting.NoOpDpEvent(),
        l2_norm_clip=1.0,
        noise_multiplier=0.0,
        seed=0,
        **ADAFEST,
    ),
}


def _train(fe, mechanism, *, neighbour: bool):
    """Two steps on D (or D'); returns (table after training, privacy report)."""
    ids = np.array(IDS + ([EXTRA] if neighbour else []), np.int32)
    weights = np.array([1.0] * len(IDS) + ([1e-30] if neighbour else []), np.float32)
    labels = np.zeros([len(ids), 1], np.float32)
    data = tf.data.Dataset.from_tensors((ids, labels, weights)).repeat(2)
    keras = fe.keras
    keras.utils.set_random_seed(0)
    inputs = keras.Input((2,), dtype="int32")
    table = fe.DPEmbedding(VOCAB, DIM, combiner="sum", name="table")
    model = keras.Model(inputs, table(inputs))
    dp = fe.dp_model(model, mechanism, batch=BATCH, lr=0.5, loss=lambda y, p: tf.reduce_sum(p, axis=-1))
    dp.fit(data, epochs=1, verbose=0)
    dp.flush()
    report = privacy_report(
        mechanism=mechanism,
        delta=1e-5,
        sampling_probability=BATCH / 100,
        dataset_size=100,
        accountant="rdp",
        steps=int(mechanism.steps.numpy()),
        batching="fixed_shuffled",  # as fed (the same for D and D')
    )
    return table.embeddings.numpy(), report


def _keys(value) -> set:
    if isinstance(value, dict):
        return set(value) | set().union(*(_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_keys(v) for v in value)) if value else set()
    return set()


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_report_is_a_function_of_the_release(fe, name):
    released, report = _train(fe, MECHANISMS[name](), neighbour=False)
    released_neighbour, report_neighbour = _train(fe, MECHANISMS[name](), neighbour=True)
    # The release is the same for D and D' (the extra example changes nothing the mechanism outputs) ...
    np.testing.assert_array_equal(released, released_neighbour)
    # ... so a report written beside it must be the same too: no field measures the un-noised data.
    assert json.dumps(report, sort_keys=True) == json.dumps(report_neighbour, sort_keys=True)
    assert not _keys(report) & DENYLIST, sorted(_keys(report) & DENYLIST)


def test_adafest_statistics_of_unnoised_touches_stay_in_diagnostics(fe):
    mechanism = MECHANISMS["adafest"]()
    _train(fe, mechanism, neighbour=True)
    diagnostics = mechanism.diagnostics()
    assert diagnostics["not_differentially_private"] is True
    # Per step: 14 rows touched (4 read twice, 8 + 2 read once), the 10 read once are dropped.
    assert diagnostics["tables"][0]["mean_touched_rows"] == 14
    assert diagnostics["tables"][0]["dropped_touched_fraction"] == pytest.approx(10 / 14)


def test_non_private_report_has_no_data_statistics(fe):
    mechanism = NonPrivate(seed=0)
    _, report = _train(fe, mechanism, neighbour=False)
    assert report["is_dp"] is False and not _keys(report) & DENYLIST
