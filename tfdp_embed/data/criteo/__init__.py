"""Criteo display-ads data: the streaming reader, its schema, and a synthetic generator.

Modules, in reading order:

* `schema.py`: feature names, DP-FEST Table 3 vocabularies, table sizes;
* `errors.py`: `CriteoFormatError` and the reasons a row can be skipped;
* `rows.py`: the row rules, applied to blocks of lines with numpy;
* `text.py`: files (plain or gzip) read block by block, `CriteoReadStats`;
* `transform.py`: `parse_raw_fields`, the TF transform shared by training
  and serving;
* `reader.py`: `criteo_dataset` and the day-file and running-count helpers;
* `synthetic.py`: Criteo-like files for tests and scale runs;
* `tfds.py`: a TFDS builder (not imported here, so that
  `tensorflow_datasets` is only loaded when asked for).

References: DP-FEST (Ghazi et al., NeurIPS 2023) §4.1.1, §4.3, App. D.1.
"""

from tfdp_embed.data.criteo.errors import SKIP_REASONS, CriteoFormatError
from tfdp_embed.data.criteo.reader import criteo_dataset, criteo_lines, day_files, running_counts, streaming_periods
from tfdp_embed.data.criteo.schema import (
    CAT_FEATURES,
    CRITEO_VOCAB_SIZES,
    INT_FEATURES,
    INT_MISSING,
    LABEL,
    MISSING_BUCKET,
    embedding_dim,
    resolve_vocab_sizes,
    table_sizes,
)
from tfdp_embed.data.criteo.text import CriteoReadStats, scan_files
from tfdp_embed.data.criteo.transform import parse_raw_fields

__all__ = [
    "CAT_FEATURES",
    "CRITEO_VOCAB_SIZES",
    "INT_FEATURES",
    "INT_MISSING",
    "LABEL",
    "MISSING_BUCKET",
    "SKIP_REASONS",
    "CriteoFormatError",
    "CriteoReadStats",
    "criteo_dataset",
    "criteo_lines",
    "day_files",
    "embedding_dim",
    "parse_raw_fields",
    "resolve_vocab_sizes",
    "running_counts",
    "scan_files",
    "streaming_periods",
    "table_sizes",
]
