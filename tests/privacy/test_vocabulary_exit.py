"""Attacks (issue 33, N4 and N7): read who is in the training data off a vocabulary the model ships.

N7: a `StringLookup` adapted on the training rows and a `Normalization`
adapted on them (the standard TFRS recipe) ship unnoised in a DP model: a
new user's id is in the vocabulary, and with the other rows known the
target's feature value is N mean(D) - sum(D without the target), exactly.
`DPModel` must refuse such layers unless their state is a DP release or
declared public; layers built from DP releases are accepted.

N4: the sequential pipeline numbered items 1..(largest id in the file), so
the table shapes and the serving's `known_ids` said whether the one user
holding the largest id was in the data, with certainty. The item ids are
now a DP vocabulary (Gaussian thresholding, unit = user): the key only
that user holds is released with probability <= delta_thr, and the shapes
of neighbouring datasets are the same unless that happens.

The two N7 attacks run for both front ends (the `fe` fixture of
tests/conftest.py); `declare_public`, the DP preprocessing layers and the
pipelines (N4) are tf-keras's.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.mechanisms.dense import DenseDPSGD

N, DIM, BATCH = 40, 3, 8
TARGET_ID, TARGET_AGE = "user_target", 87.25


def _rows(with_target: bool) -> tuple:
    rng = np.random.default_rng(0)
    users = np.array([f"user_{i}" for i in range(N)])
    ages = np.round(rng.uniform(18, 70, N), 2)
    if with_target:
        users, ages = np.append(users, TARGET_ID), np.append(ages, TARGET_AGE)
    labels = rng.integers(0, 2, len(users)).astype(np.float32)
    return users, ages.astype(np.float32), labels


def _model(fe, lookup, normalization):
    """ids -> (lookup) -> DPEmbedding, age -> Normalization; concatenated -> Dense(1), on front end `fe`."""
    keras, DPEmbedding = fe.keras, fe.DPEmbedding
    user = keras.Input((1,), dtype=tf.string if lookup is not None else tf.int32, name="user")
    age = keras.Input((1,), dtype=tf.float32, name="age")
    ids = lookup(user) if lookup is not None else user
    size = lookup.vocabulary_size() if lookup is not None else N + 1
    table = DPEmbedding(size, DIM, combiner="mean", name="users")
    features = keras.layers.Concatenate()([table(ids), normalization(age)])
    out = keras.layers.Dense(1, name="out", kernel_initializer=keras.initializers.GlorotUniform(seed=1))(features)
    return keras.Model({"user": user, "age": age}, out)


def _fit(fe, model, users, ages, labels):
    dp = fe.dp_model(model, DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=3), batch=BATCH, lr=0.1)
    data = tf.data.Dataset.from_tensor_slices(({"user": users[:, None], "age": ages[:, None]}, labels[:, None]))
    dp.fit(data.batch(BATCH), epochs=1, verbose=0)
    return dp


# Keras 3 (ca59a97 to f329fa5): the front end had no check of adapted preprocessing layers: the
# Normalization was accepted and the target's age read off its mean to ~1e-4 (the check is now the core's,
# `tfdp_embed.contract.preprocessing`, for both front ends).
N7_CASES = ["keras2", "keras3"]


@pytest.mark.parametrize("fe", N7_CASES, indirect=True)
def test_adapted_normalization_is_refused(fe):
    users, ages, labels = _rows(with_target=True)
    normalization = fe.keras.layers.Normalization()
    normalization.adapt(ages[:, None])
    row_ids = np.arange(len(users), dtype=np.int32) % (N + 1)
    try:
        _fit(fe, _model(fe, None, normalization), row_ids, ages, labels)
    except PrivacyContractError as error:
        assert "Normalization" in str(error) and "dp_normalization_statistics" in str(error)
        return
    # Accepted: the attack on what the model holds (the exported SavedModel holds the same mean).
    recovered = float(np.ravel(normalization.mean)[0]) * (N + 1) - ages[:-1].astype(np.float64).sum()
    pytest.fail(
        f"DPModel trained with a Normalization adapted on the training rows: the target's age recovered from the "
        f"mean: {recovered:.3f} (true {TARGET_AGE}, error {abs(recovered - TARGET_AGE):.2g})"
    )


@pytest.mark.parametrize("fe", N7_CASES, indirect=True)
def test_lookup_built_from_the_training_rows_is_refused(fe):
    users, ages, labels = _rows(with_target=True)
    layers = fe.keras.layers
    lookup = layers.StringLookup(vocabulary=np.unique(users))  # the TFRS recipe: the ids of the training rows
    normalization = layers.Normalization(mean=40.0, variance=100.0)
    declare_public = _new_api("declare_public")
    if declare_public is not None:
        declare_public(normalization, source="fixed constants")  # only the lookup is under attack here
    try:
        _fit(fe, _model(fe, lookup, normalization), users, ages, labels)
    except PrivacyContractError as error:
        assert "StringLookup" in str(error) and "dp_vocabulary" in str(error) and "Normalization" not in str(error)
        return
    pytest.fail(
        f"DPModel trained with a vocabulary of the training rows: the new user's id is in it: "
        f"{TARGET_ID in lookup.get_vocabulary()}"
    )


def _new_api(name: str):
    """`declare_public` where it exists (absent before the fix, when nothing is refused anyway)."""
    try:
        from tfdp_embed.keras2.contract import preprocessing
    except ImportError:
        return None
    return getattr(preprocessing, name)


@pytest.mark.parametrize("fe", ["keras2"], indirect=True)  # declare_public, dp_preprocessing: tf-keras only
def test_dp_built_and_declared_public_layers_are_accepted(fe):
    from tfdp_embed.data.vocabulary import dp_vocabulary
    from tfdp_embed.keras2.contract.preprocessing import declare_public
    from tfdp_embed.keras2.dp_preprocessing import dp_normalization_statistics, lookup_layer, normalization_layer

    users, ages, labels = _rows(with_target=True)
    # Each user holds its own id; "user_0" is also held by 400 more units (a shared id). Only that one passes
    # the threshold (a one-holder key passes with probability <= delta_thr = 5e-7); the rest map to OOV.
    units = [[u] for u in users] + [["user_0"]] * 400
    vocab = dp_vocabulary(units, max_keys_per_unit=1, epsilon=1.0, delta=1e-6, seed=0)
    assert vocab.keys.tolist() == ["user_0"]
    stats = dp_normalization_statistics(ages, clip_range=(0.0, 100.0), epsilon=1.0, delta=1e-6, seed=0)
    recovered = float(stats.mean[0]) * (N + 1) - ages[:-1].astype(np.float64).sum()
    assert abs(recovered - TARGET_AGE) > 1.0, recovered  # noise std of the mean x (N + 1): tens of years
    catalogue = declare_public(keras.layers.StringLookup(vocabulary=["user_0", "user_1"]), source="a public list")
    # (DPModel's state check reads every non-trainable variable: the lookups' vocabularies must pass it too)
    _fit(fe, _model(fe, catalogue, normalization_layer(stats)), users, ages, labels)
    _fit(fe, _model(fe, lookup_layer(vocab), normalization_layer(stats)), users, ages, labels)


def test_declaring_needs_a_source():
    from tfdp_embed.keras2.contract.preprocessing import declare_public

    with pytest.raises(ValueError, match="`source`"):
        declare_public(keras.layers.StringLookup(vocabulary=["a"]), source=" ")
    with pytest.raises(TypeError, match="preprocessing layer"):
        declare_public(keras.layers.Dense(1), source="x")


# -- N4: the sequential pipeline's item ids ------------------------------------------------------------------

RARE_ITEM = 999  # held by one user only, the largest id of the file
SEQ_FLAGS = [
    "--epochs",
    "1",
    "--batch",
    "40",
    "--max-len",
    "6",
    "--dim",
    "8",
    "--blocks",
    "1",
    "--verbose",
    "0",
    "--seed",
    "5",
    "--epsilon",
    "5",
    "--delta",
    "1e-4",
    "--accountant",
    "rdp",
]


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory):
    """Two sequence files: 300 users on items 1..60, and the same plus a last user holding only item 999."""
    from tfdp_embed.data.sequences import write_synthetic_sequences

    root = tmp_path_factory.mktemp("n4")
    without = write_synthetic_sequences(str(root / "without.txt"), num_users=300, num_items=60, seed=1)
    with_target = root / "with.txt"
    with_target.write_text(open(without).read() + "".join(f"301 {RARE_ITEM}\n" for _ in range(5)))
    return {"without": without, "with": str(with_target)}


def _sequential_release(data: str, out) -> dict:
    """What the exported SavedModel says about the item ids: table rows and whether item 999 is known."""
    from pipelines import sequential

    assert sequential.main(["--data", data, "--out", str(out), *SEQ_FLAGS]) == 0
    loaded = tf.saved_model.load(str(out / "saved_model"))
    answer = loaded.signatures["serving_default"](history=tf.constant([[RARE_ITEM]], tf.int32))
    return {"rows": int(loaded.model.item_log_prior.shape[0]), "knows_rare": int(answer["known_ids"].numpy()[0])}


def test_the_user_holding_the_largest_item_id_is_not_identified(neighbours, tmp_path):
    seen = {name: _sequential_release(path, tmp_path / name) for name, path in neighbours.items()}
    # Old code: rows 61 vs 1000 and known_ids 0 vs 1: membership of user 301 read with certainty.
    assert seen["with"] == seen["without"], f"the exported model tells the neighbouring datasets apart: {seen}"
    assert seen["with"]["knows_rare"] == 0


# -- the MovieLens movie-id map read off the ratings alone (no catalogue) ---------------------------------------

RARE_MOVIE = 99999  # rated once, by a user who rated nothing else


@pytest.fixture(scope="module")
def ratings_only(tmp_path_factory):
    """ml-100k's u.data without its catalogue, and the same plus one user rating movie 99999 once."""
    from pipelines import movielens

    source = movielens.DEFAULT_DATA_PATH
    if not os.path.exists(source):
        pytest.skip(f"MovieLens ml-100k not found at {source}")
    root = tmp_path_factory.mktemp("ml")
    ratings = open(source).read()
    (root / "without").mkdir()
    (root / "with").mkdir()
    (root / "without" / "u.data").write_text(ratings)
    (root / "with" / "u.data").write_text(ratings + f"944\t{RARE_MOVIE}\t5\t893286638\n")
    return {name: str(root / name / "u.data") for name in ("without", "with")}


def _movielens_release(path: str, out) -> dict:
    from pipelines import movielens

    flags = [
        "--data",
        path,
        "--mechanism",
        "dense",
        "--epsilon",
        "3",
        "--epochs",
        "1",
        "--batch-size",
        "1024",
        "--seed",
        "0",
        "--out",
        str(out),
        "--quiet",
    ]
    if importlib.util.find_spec("pipelines.movielens.vocabulary") is not None:  # the fix's flag (absent before)
        flags += ["--vocabulary-epsilon-share", "0.5"]  # ml-100k has 943 users: 10% of epsilon 3 keeps 1 movie
    if importlib.util.find_spec("pipelines.movielens.units") is not None:  # user level is the default now:
        flags += ["--privacy-unit", "example"]  # batch 1024 > 757 users; this exit is about the vocabulary
    assert movielens.main(flags) == 0
    loaded = tf.saved_model.load(str(out / "retrieval_saved_model"))
    answer = loaded.signatures["serving_default"](history=tf.constant([[RARE_MOVIE]], tf.int32))
    shipped = json.loads((out / "retrieval_saved_model" / "privacy_report.json").read_text())
    return {"knows_rare": int(answer["known_ids"].numpy()[0]), "assumptions": shipped["assumptions"]}


def test_a_movie_rated_once_is_not_in_the_ratings_only_map(ratings_only, tmp_path):
    seen = {name: _movielens_release(path, tmp_path / name) for name, path in ratings_only.items()}
    # Old code: known_ids 1 with the rating, 0 without; and an assumption that the map is public.
    assert seen["with"]["knows_rare"] == seen["without"]["knows_rare"] == 0, seen
    assert seen["with"]["assumptions"] == [] and seen["without"]["assumptions"] == [], seen
