"""DP-AdaFEST in the MovieLens two-tower pipeline; DP-FEST and DP-AdaFEST+ refused in one line (issue 31).

DP-AdaFEST trains the two-tower with its two noises (sigma1 of the contribution map, sigma2 of the gradient,
split from the calibrated sigma by `pipelines.movielens.privacy.ADAFEST_OPTIONS`): the full softmax's item rows
are scored every step, whatever the data, so they survive every step and are noised (they all move); the
history table keeps the rows whose noisy contribution passes tau. DP-FEST and DP-AdaFEST+ update only rows a
frequency selection picked before training, which would leave the other scored item rows at their initial
values: the pipeline refuses them. At user level: tests/pipelines/test_movielens_user_level.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_movielens_pipeline import tiny_config, write_ratings

from pipelines import movielens
from pipelines.movielens import privacy as movielens_privacy


@pytest.fixture(scope="module")
def ratings(tmp_path_factory):
    return write_ratings(tmp_path_factory.mktemp("ml") / "u.data")


@pytest.mark.slow  # ~30 s on the 2-core machine; the default run trains DP-AdaFEST at user level (see above)
def test_adafest_trains_the_two_tower_with_its_two_noises_and_its_audit_stays_below_the_claim(ratings):
    """An audit run (example level, 64 rare-id canaries, sigma 1 given): the plan's two noises and tau, every item row
    moved, and the one-run bound at or below the run's epsilon (observed 0.0 against 1.48)."""
    from tfdp_embed import keras
    from tfdp_embed.keras2.models.two_tower import TwoTowerModel

    config = tiny_config(ratings, mechanism="adafest", noise_multiplier=1.0, epochs=1, audit_canaries=64)
    result = movielens.train_and_evaluate(config)
    report = result.report
    assert report["mechanism"] == "adafest" and report["is_dp"] and report["epsilon"] > 0
    audit = report["audit"]
    assert audit["claimed_epsilon"] == report["epsilon"] and 0.0 <= audit["epsilon_lb"] <= report["epsilon"], audit
    assert report["steps_run"] == report["planned_steps"] > 0 and np.isfinite(report["final_train_loss"])
    arguments = report["extra"]["plan"]["mechanism_arguments"]
    sigma1, sigma2 = arguments["contribution_noise_multiplier"], arguments["noise_multiplier"]
    assert sigma1 > 0 and sigma2 > 0  # ratio 1: sigma1 = sigma2 = sigma * sqrt(2)
    assert sigma1 == pytest.approx(sigma2) == pytest.approx(np.sqrt(2.0))
    assert arguments["threshold"] == pytest.approx(2.0 * sigma1 * 1.0)  # tau = 2 sigma1 C1
    # the pipeline's model rebuilt at its seed: every item row (scored every step) moved from its initial value
    keras.utils.set_random_seed(config.seed)
    initial = TwoTowerModel(num_items=result.data.num_items, embedding_dim=8, hidden_units=(16,))
    initial(np.ones((2, 3), np.int32))
    moved = np.linalg.norm(
        result.model.item_embedding.candidates().numpy() - initial.item_embedding.candidates(), axis=1
    )
    assert np.all(moved > 0), moved


@pytest.mark.parametrize("mechanism, name", [("fest", "DP-FEST"), ("adafest+", "DP-AdaFEST+")])
def test_fest_and_adafest_plus_are_refused_in_one_line(ratings, tmp_path, capsys, mechanism, name):
    with pytest.raises(SystemExit) as exit_:
        movielens.main(["--data", ratings, "--out", str(tmp_path / "run"), "--mechanism", mechanism,
                        "--epsilon", "4", "--epochs", "1", "--quiet"])  # fmt: skip
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--mechanism {mechanism}: {name} updates only" in error and "full softmax" in error
    with pytest.raises(ValueError, match="full softmax scores every item row"):
        tiny_config(ratings, mechanism=mechanism, epsilon=4.0)
    with pytest.raises(ValueError, match="full softmax scores every item row"):
        movielens_privacy.plan(mechanism=mechanism, noise_multiplier=None, epsilon=4.0, delta=1e-5,
                               sampling_probability=0.1, steps=10, l2_norm_clip=1.0)  # fmt: skip
