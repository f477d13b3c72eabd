"""The MovieLens pipeline's movie ids without a catalogue: a DP vocabulary of the ratings (unit = user).

The exported model holds the movie-id map (`RetrievalServingModule`); read
off the ratings alone it lists every movie somebody rated, so a movie rated
once is in the map exactly when that rating is (issue 33). Now:

    a catalogue beside the ratings (u.item, movies.csv) or given:  its ids, nothing spent (public)
    no catalogue, a DP run (dense, lazy):  the movies released by `dp_vocabulary` over users (each user's
        D0 most recent distinct movies, per-unit weights 1/sqrt(k)), a Gaussian `Release` in the ledger
        (sized for `vocabulary_epsilon_share` of epsilon, or `vocabulary_noise_multiplier` with sigma given);
        its threshold's delta_thr is reported beside delta (`delta_with_vocabulary`)
    no catalogue, eana or none:  the ratings' movies, with a caveat (these runs have no DP guarantee)

The vocabulary's unit is the user (all of a user's ratings), not the
training's example; a user-level release protects every example of a user.
Movies outside the map are dropped from the timelines; test positions whose
movie was dropped are misses (`scale_metrics`).

References: Gopi et al., "Differentially private set union", ICML 2020 (weighted Gaussian).
"""

from __future__ import annotations

import numpy as np

from tfdp_embed import Release
from tfdp_embed.accounting.one_off_releases import release_noise_multiplier
from tfdp_embed.data import vocabulary as vocabulary_lib
from tfdp_embed.data.item_ids import ItemIdMap
from tfdp_embed.data.movielens import MovieLensData, user_timelines
from tfdp_embed.data.movielens_files import catalogue_path, read_ratings
from tfdp_embed.data.vocabulary import DPVocabulary, dp_vocabulary
from tfdp_embed.mechanisms import mechanism_class

MOVIE_VOCABULARY = "movie_vocabulary"
DEFAULT_EPSILON_SHARE = 0.1
DEFAULT_NOISE_MULTIPLIER = 4.0
"""z of the release when sigma is given (no target to take a share of)."""
DEFAULT_MAX_ITEMS_PER_USER = 100
SIZING_DELTA = 1e-5
"""The delta a share is sized at when no `delta` is given (sizing only: the accountant composes the event)."""
THRESHOLD_DELTA_SHARE = 0.1


def needs_release(config, ratings_path: str) -> bool:
    """True when the movie ids must come from a DP release: a DP run, no catalogue beside the ratings or given."""
    catalogue = catalogue_path(ratings_path) if config.item_catalogue == "auto" else config.item_catalogue
    return catalogue is None and mechanism_class(config.mechanism).is_dp  # dense, lazy: not eana, none


def release_noise(config) -> float:
    """z of the movie-set release: sized for its share of the target epsilon, or the given / default z."""
    if config.vocabulary_noise_multiplier is not None:
        return float(config.vocabulary_noise_multiplier)
    if config.epsilon is None:
        return DEFAULT_NOISE_MULTIPLIER
    share = DEFAULT_EPSILON_SHARE if config.vocabulary_epsilon_share is None else config.vocabulary_epsilon_share
    delta = SIZING_DELTA if config.delta is None else config.delta
    return release_noise_multiplier(epsilon=share * config.epsilon, delta=delta)


def dp_movie_ids(config, ratings_path: str) -> tuple[ItemIdMap, DPVocabulary]:
    """The movie-id map released with DP from the ratings (one unit = one user, most recent movies first).

    Raises:
      ValueError: no movie passed the threshold (a larger share of epsilon, or a catalogue).
    """
    ratings = read_ratings(ratings_path)
    timelines = user_timelines(ratings)
    threshold_delta = THRESHOLD_DELTA_SHARE * (SIZING_DELTA if config.delta is None else config.delta)
    vocab = dp_vocabulary(
        [timeline[::-1].tolist() for timeline in timelines.values()],
        max_keys_per_unit=config.vocabulary_max_items,
        noise_multiplier=release_noise(config),
        delta=SIZING_DELTA + threshold_delta if config.delta is None else config.delta + threshold_delta,
        threshold_delta=threshold_delta,
        seed=config.seed,
        name=MOVIE_VOCABULARY,
        weighting="per_unit",
    )
    if vocab.keys.size < 2:  # an example needs two movies
        raise ValueError(
            f"The movie-id release selected {vocab.keys.size} movie(s) (an example needs 2): too few users rate "
            "the same movies for its noise. Allowed: "
            "a larger `vocabulary_epsilon_share` / smaller `vocabulary_noise_multiplier`, or the catalogue "
            "(u.item, movies.csv) beside the ratings or given as `item_catalogue`."
        )
    return ItemIdMap(vocab.keys.astype(np.int64), source="DP vocabulary of the ratings (unit = user)"), vocab


def check_data(config, data: MovieLensData) -> None:
    """Refuses a DP run on data whose movie-id map was read off the ratings without a DP release.

    Raises:
      ValueError: names the way out (`load_movielens(config)` for this config, or a catalogue).
    """
    source = data.item_ids.source if data.item_ids is not None else ""
    if mechanism_class(config.mechanism).is_dp and data.item_release is None and not source.startswith("catalogue"):
        raise ValueError(
            f"The data's movie-id map ({source or 'none'}) lists every rated movie and would ship with a "
            f"{config.mechanism!r} model outside its DP guarantee. Allowed: data loaded with this config "
            "(`load_movielens(config)` releases the map with DP), or a catalogue (u.item, movies.csv)."
        )


def releases(vocabulary: DPVocabulary | None, *, seeded: bool = False) -> list:
    """The plan's release for a DP movie-id map (none otherwise); `seeded`: drawn from `--seed`."""
    return [] if vocabulary is None else [Release(MOVIE_VOCABULARY, event=vocabulary.event, seeded=seeded)]


def report_terms(data: MovieLensData, vocabulary: DPVocabulary | None, mechanism: str) -> tuple[dict, list]:
    """(extra report fields, caveats) about the movie-id map."""
    source = data.item_ids.source if data.item_ids is not None else "none"
    if vocabulary is not None:
        return {"movie_vocabulary": {**vocabulary.summary(), "privacy_unit": "user (all their ratings)"}}, []
    if source.startswith("catalogue"):
        return {}, []
    return {}, [
        f"The movie-id map shipped with the model ({source}) lists every movie some user rated: it is not "
        f"private ({mechanism} has no DP guarantee; DP runs release it with `dp_vocabulary` instead)."
    ]


def add_threshold_delta(report: dict, vocabulary: DPVocabulary | None) -> dict:
    """`delta_with_vocabulary` and its caveat for a DP movie-id map."""
    return vocabulary_lib.add_threshold_delta(report, vocabulary, what="movie-id map")


def scale_metrics(metrics: dict, data: MovieLensData, evaluated: int) -> dict:
    """precision@k / recall@k over every test position: those that could not be ranked count as misses."""
    total = data.test_positions
    if not total or evaluated >= total:
        return metrics
    factor = evaluated / total
    scaled = {k: (v * factor if k.startswith(("precision@", "recall@")) else v) for k, v in metrics.items()}
    scaled["unranked_test_positions"] = total - evaluated
    return scaled


__all__ = [
    "DEFAULT_EPSILON_SHARE",
    "DEFAULT_MAX_ITEMS_PER_USER",
    "MOVIE_VOCABULARY",
    "add_threshold_delta",
    "check_data",
    "dp_movie_ids",
    "needs_release",
    "release_noise",
    "releases",
    "report_terms",
    "scale_metrics",
]
