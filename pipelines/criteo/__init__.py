"""Criteo pCTR training with differential privacy, from raw TSV to a served SavedModel.

    python -m pipelines.criteo --train day_0 day_1 --eval day_2 --mechanism adafest \\
        --epsilon 3 --epochs 1 --batch 1024 --out saved_models/criteo [--streaming-periods] \\
        [--streaming {auto,on,off}]

With no `--train` it writes a small synthetic Criteo set (Table 3 vocabularies
x 0.1, Zipf frequencies, a learnable click signal) under `OUT/data` and
trains on it: `make run` runs exactly that, sized to finish in minutes on a
small CPU.

What happens (`pipeline.run`, one function per stage):
  1. read and validate the files, Criteo TSV or CSV (`--format`, detected per
     file by default; bad rows: an error naming file, line and field, or
     counted skips with `--skip-bad-rows`); choose the settings the flags
     left unset from the training rows N (batch, tower, learning rate, hash
     size; `defaults.py`) and print them. `--streaming auto` (default)
     keeps a period of up to 10^6 rows in memory and streams larger ones:
     one validating scan counts the rows (and, for DP-FEST / AdaFEST+, the
     bucket counts), then exact Poisson batches are read from the files,
     G = `--stream-buffer-rows` // B batches per pass, so memory does not
     grow with the rows (`data.py`);
  2. calibrate the noise for (epsilon, delta = 1/N by default), q = B / N and
     T = epochs x round(N / B) steps with `dp_accounting` (PLD); several
     streaming periods compose in parallel (`tfdp_embed.plan_run`, `privacy.py`);
  3. train the DP-FEST App. D.1 pCTR model (or DCN-v2) with `DPModel` on
     Poisson-sampled batches (LazyDP: `--lookahead` adds the one-batch lookahead; DP-FEST and
     DP-AdaFEST+: DP top-k selection from bucket counts, DP-FEST re-selected
     from running counts each streaming period); training stops at the
     calibrated step count (`training.py`);
  4. with `--streaming-periods`, each training file is one period (a day):
     train on it, evaluate on the next day (DP-FEST §4.3; `evaluation.py`);
  5. flush owed noise, then the DP output calibration (`--calibration-fraction`
     of epsilon, default 5%): shift the output bias so the mean prediction
     matches a DP estimate of the click rate from a random subset of the
     training rows, which corrects DP-SGD's
     clipping bias (`calibration.py`; by default skipped, its epsilon given
     to training, when its noise, known in advance, is too large to help).
     A run whose training loss turns non-finite or explodes, or whose model
     then collapses, stops here with exit status 1 and exports nothing
     (`divergence.py`);
  6. export `OUT/saved_model` (no optimizer or mechanism state;
     `serving_default` takes the raw Criteo fields as strings, see
     `tfdp_embed.keras2.models.ctr_serving`) with `privacy_report.json` beside it;
  7. write `OUT/report.json` (AUC (null with `auc_note` on a single-class
     evaluation file), log loss and the base-rate log loss, mean prediction,
     the chosen settings, privacy, which
     sampler, rows read and skipped, gradient-size reduction, median step
     time) and print the privacy report (`report.py`). `OUT` appears whole or not
     at all: a run that fails, is interrupted or killed leaves it as it was
     (`pipelines.output_dir`).

The flags are parsed in `cli.py` into a `config.PipelineConfig`.

References: DP-FEST (Ghazi et al., NeurIPS 2023) §4, App. D.1; LazyDP
(ASPLOS 2024) §5; EANA (RecSys 2022) §3.
"""

from pipelines.criteo.cli import build_parser, main, parse_args
from pipelines.criteo.config import PipelineConfig
from pipelines.criteo.pipeline import PipelineResult, run

__all__ = ["PipelineConfig", "PipelineResult", "build_parser", "main", "parse_args", "run"]
