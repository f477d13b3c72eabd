"""MovieLens next-movie retrieval (EANA §4.1) with DP-SGD, EANA, LazyDP or no privacy.

    python -m pipelines.movielens --mechanism eana --noise-multiplier 0.01 --epochs 5 --out runs/eana
    python -m pipelines.movielens --mechanism dense --epsilon 3 --epochs 5 --out runs/dense
    python -m pipelines.movielens --privacy-unit example --mechanism dense --epsilon 3 --epochs 5 --out runs/ex

The privacy unit (`units.py`): by default a training user's whole timeline
(`--privacy-unit user`: Poisson over users, at most `--max-examples-per-user`
K examples of a sampled user per step, packed `[users, K, L]`, one clipped
gradient per user; q, N~ and delta in users); `--privacy-unit example` is the
run over (context, label) examples, whose report adds the group-privacy
epsilon of a user with the median and with the most examples.

What happens:
  1. read the ratings (`--data`: ml-100k `u.data`, ml-latest / ML-20M
     `ratings.csv`, ML-1M `ratings.dat`, or a dataset directory holding one;
     default ../shared/data/movielens/ml-100k/u.data), number the movies
     densely 1..n (from the catalogue beside the ratings, `movies.csv` /
     `u.item`, when there is one; else, for DP runs, from the ratings' movie
     set released with DP, `vocabulary.py`), build
     per-user timelines, split users 80/20 (seeded), build every (context,
     label) pair of the training users (the privacy units; see
     `tfdp_embed.data.movielens` for what an example is and what epsilon
     protects) plus any extra fixed examples (secret-sharer canaries);
  2. q = batch_size / N, T = epochs x round(1/q) steps; sigma given, or
     calibrated for (epsilon, delta = 1/N by default) with `dp_accounting` (PLD);
  3. train the two-tower model (`tfdp_embed.keras2.models.two_tower`: bag-of-words
     context tower, item lookup label tower, full softmax over all items)
     with `DPModel` on Poisson-sampled batches (LazyDP with the one-batch
     lookahead), a privacy budget stopping DP runs at the target epsilon;
  4. flush (LazyDP's owed noise), evaluate precision@k / recall@k for
     k in {1, 5, 10, 20} ranking all items for every test position, next to
     two references that are not released: chance and the most-popular
     ranking of the training split (`tfdp_embed.metrics.baselines`);
  5. with an output directory: export `DIR/retrieval_saved_model/` (history of
     ORIGINAL movie ids -> top-k original ids and scores; the id map inside;
     unknown ids dropped, see `two_tower_serving`; privacy report beside it)
     and write `DIR/report.json`. `DIR` appears whole or not at all: a run that fails, is
     interrupted or killed leaves it as it was (`pipelines.output_dir`).

Modules: `cli.py` (flags), `config.py`, `data.py` (pool and batches), `units.py` (user or example level),
`training.py` (stages 1-4), `report.py`, `pipeline.py` (the run and the
export), `privacy.py` (EANA's bounds, nominal epsilon), `vocabulary.py`
(the DP movie-id release). Public API (used by the secret-sharer audit): `MovieLensConfig`,
`load_movielens`, `train_and_evaluate`, `MovieLensResult` (`.model`,
`.report`, `.log_probs(contexts, labels)`).

References: Berlowitz et al., "EANA", RecSys 2022, §4.1; Lim et al.,
"LazyDP", ASPLOS 2024, §5; Abadi et al. 2016 (DP-SGD, Poisson sampling).
"""

from pipelines.movielens.cli import build_parser, main, parse_args
from pipelines.movielens.config import (
    DEFAULT_DATA_PATH,
    DEFAULT_LEARNING_RATES,
    LARGE_NOISE_LEARNING_RATE,
    SMALL_SIGMA_FOR_PLD,
    MovieLensConfig,
)
from pipelines.movielens.data import load_movielens
from pipelines.movielens.pipeline import MovieLensResult, train_and_evaluate
from pipelines.movielens.report import baselines, format_report
from pipelines.movielens.training import evaluate

__all__ = [
    "DEFAULT_DATA_PATH",
    "DEFAULT_LEARNING_RATES",
    "LARGE_NOISE_LEARNING_RATE",
    "SMALL_SIGMA_FOR_PLD",
    "MovieLensConfig",
    "MovieLensResult",
    "baselines",
    "build_parser",
    "evaluate",
    "format_report",
    "load_movielens",
    "main",
    "parse_args",
    "train_and_evaluate",
]
