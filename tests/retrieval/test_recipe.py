"""`RetrievalRecipe`: the defaults the retrieval benchmark measured, the optimizer and negatives they build."""

from __future__ import annotations

import pytest

from tfdp_embed.keras2._keras import keras
from tfdp_embed.keras2.retrieval import FullSoftmax, SampledSoftmax
from tfdp_embed.keras2.retrieval.recipe import RetrievalRecipe


def test_defaults_are_the_measured_recipe():
    # Picked on a validation split of ml-100k (benchmarks.retrieval; RESULTS "DP retrieval task vs TFRS"):
    # full softmax, SGD 2.0 cosine-decayed to 0 over 12 epochs of batches of 512.
    assert RetrievalRecipe().get_config() == {
        "negatives": "full",
        "num_negatives": 256,
        "learning_rate": 2.0,
        "momentum": 0.0,
        "cosine_decay": True,
        "epochs": 12,
        "batch_size": 512,
    }


def test_optimizer_is_legacy_sgd_cosine_decayed_to_zero_over_the_run():
    optimizer = RetrievalRecipe().optimizer(steps=100)
    assert isinstance(optimizer, keras.optimizers.legacy.SGD)
    schedule = optimizer.learning_rate
    assert isinstance(schedule, keras.optimizers.schedules.CosineDecay)
    # 2.0 * (1 + cos(pi t / 100)) / 2: 2.0 at t = 0, 1.0 at t = 50, 0 at t = 100
    assert [float(schedule(t)) for t in (0, 50, 100)] == pytest.approx([2.0, 1.0, 0.0], abs=1e-6)
    constant = RetrievalRecipe(cosine_decay=False, momentum=0.9).optimizer(steps=100)
    assert float(constant.learning_rate) == pytest.approx(2.0) and float(constant.momentum) == pytest.approx(0.9)


def test_negatives_full_by_default_or_a_seeded_uniform_sample():
    assert isinstance(RetrievalRecipe().make_negatives(seed=0), FullSoftmax)
    sampled = RetrievalRecipe(negatives="sampled", num_negatives=64).make_negatives(seed=7)
    assert isinstance(sampled, SampledSoftmax) and sampled.num_negatives == 64 and sampled.seed == 7
    assert sampled.probabilities is None and sampled.log_q_correction


def test_config_round_trips_and_the_recipe_is_frozen():
    recipe = RetrievalRecipe(negatives="sampled", learning_rate=0.5, epochs=3)
    assert RetrievalRecipe.from_config(recipe.get_config()) == recipe
    with pytest.raises(AttributeError):
        recipe.epochs = 4


@pytest.mark.parametrize(
    "arguments, named",
    [
        ({"negatives": "in-batch"}, "`negatives`"),
        ({"learning_rate": 0.0}, "`learning_rate`"),
        ({"momentum": 1.0}, "`momentum`"),
        ({"epochs": 0}, "`epochs`"),
        ({"batch_size": 1.5}, "`batch_size`"),
    ],
)
def test_bad_values_are_refused_naming_the_argument(arguments, named):
    with pytest.raises(ValueError, match=named):
        RetrievalRecipe(**arguments)


def test_optimizer_needs_a_step_count():
    with pytest.raises(ValueError, match="`steps`"):
        RetrievalRecipe().optimizer(steps=0)
