"""Next-item prediction with user-level DP: SASRec-style Transformer or DPFormer, NDCG@10 / HIT@10.

    python -m pipelines.sequential --data ../shared/data/sasrec/amazon_games.txt \\
        --model dpformer --epsilon 8 --delta 1e-5 --epochs 5 --out runs/games_dpformer

What happens:
  1. read the sequence file (time-ordered per user; SASRec "user item" pairs
     or S3-Rec "user item item ..." lines, `--layout`), split leave-one-out
     (last item test, second-last validation), keep the last `--max-len`
     items, left-pad with 0. One training sequence per user: the privacy unit
     is the USER (user-level DP). The item ids the model knows are the data's
     item set released with DP (`dp_vocabulary`, unit = user, D0 =
     `--vocabulary-max-items`, `--vocabulary-epsilon-share` of epsilon; never
     1..largest id) or a public `--item-catalogue` (nothing spent); other
     items are unknown (`vocabulary.py`);
  2. item frequencies p_i for Re-Attention: by default the training data's
     per-item user counts released once with a Gaussian (or Laplace)
     mechanism sized for `--frequency-epsilon-share` of epsilon (0.1), whose
     event is composed into the ledger; or public ones read from
     `--frequencies-file` with `--frequencies public` (the guarantee is then
     conditional on them being independent of the training data). Counts
     of the training data are never treated as public. With
     `--popularity-prior` the same p_i also give every logit a fixed log p_i
     and with `--head-items` they choose the head rows (post-processing of
     the release, so no further privacy cost);
  3. calibrate sigma so that the frequency release plus T = epochs x
     round(N / B) Poisson-sampled steps at q = B / N meet (epsilon, delta)
     (`tfdp_embed.plan_run` with the release, `dp_accounting`, PLD);
  4. train with `DPModel` + DenseDPSGD (exact per-example clipping: Phantom
     Clipping for the shared item table, ghost norms elsewhere), Adam with
     weight decay and DPFormer's schedule (20% linear warm-up, then linear
     decay); the plan's `PrivacyBudget` stops at the budget;
  5. evaluate on validation and test users, ranking ALL items, next to two
     references that are not released: chance and the most-popular ranking
     of the training split (`tfdp_embed.metrics.baselines`);
  6. export `OUT/saved_model` through `tfdp_embed.keras2.export.export_saved_model`
     (refuses a model that owes noise); `serving_default` maps a history of
     any length `[B, any]` to the top-10 items (padded/trimmed inside, unknown
     ids dropped: `SASRecServing`); `OUT/report.json` holds the metrics, the
     privacy report and the settings. `OUT` appears whole or not at all: a run
     that fails, is interrupted or killed leaves it as it was (`pipelines.output_dir`).

`--epsilon inf` or `--mechanism none` trains without privacy (the reference).

Modules: `cli.py` (flags), `config.py`, `training.py` (stages 2-5),
`report.py` (privacy report, export, summary), `pipeline.py` (the run),
`privacy.py` (frequencies and plan), `vocabulary.py` (the DP item-set
release), `evaluation.py` (NDCG@10 / HIT@10).

References: DPFormer (§4, App. A.9); Kang & McAuley 2018 (SASRec);
Krichene & Rendle 2020 (full-ranking metrics).
"""

from pipelines.sequential.cli import build_parser, main, parse_args
from pipelines.sequential.config import MECHANISM_NAMES, MODELS, REQUIRED_KEYS, SequentialConfig
from pipelines.sequential.pipeline import SequentialResult, run
from pipelines.sequential.report import baselines, format_summary

__all__ = [
    "MECHANISM_NAMES",
    "MODELS",
    "REQUIRED_KEYS",
    "SequentialConfig",
    "SequentialResult",
    "baselines",
    "build_parser",
    "format_summary",
    "main",
    "parse_args",
    "run",
]
