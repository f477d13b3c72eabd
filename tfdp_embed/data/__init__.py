"""Data pipelines: streaming readers, synthetic generators, TFDS builders.

The TFDS builders (e.g. `tfdp_embed.data.criteo.tfds`) are not imported
here, so that `tensorflow_datasets` is only loaded when asked for.
"""

# Poisson batches sampled by the Apache Beam job (tfdp_embed_beam), streamed from its shards in step order.
from tfdp_embed.data.beam_shards import beam_poisson_batches, read_manifest

# Criteo display ads (streaming reader, schema, helpers).
from tfdp_embed.data.criteo import (
    CRITEO_VOCAB_SIZES,
    CriteoFormatError,
    CriteoReadStats,
    criteo_dataset,
    day_files,
    embedding_dim,
    parse_raw_fields,
    running_counts,
    streaming_periods,
    table_sizes,
)
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo

# Poisson batches padded to one static shape (weight-0 padding).
from tfdp_embed.data.fixed_shape import fixed_shape_batches

# The one-batch lookahead (LazyDP).
from tfdp_embed.data.lookahead import with_lookahead

# MovieLens ml-100k timelines and (context, label) examples.
from tfdp_embed.data.movielens import (
    MovieLensData,
    MovieLensFormatError,
    load_movielens_data,
    read_item_genres,
    read_ratings,
)

# One-pass exact Poisson batches: map to steps, spill to disk, read back by step.
from tfdp_embed.data.one_pass import SpillStats, one_pass_poisson_batches

# Poisson-sampled batches (honest accounting).
from tfdp_embed.data.poisson import (
    BatchingInfo,
    fixed_size_batches,
    poisson_batches,
    streaming_poisson_batches,
)

# What `DPModel.fit` was fed: Poisson only when verified (registered samplers).
from tfdp_embed.data.provenance import FedBatching, fed_batching

# SASRec-format "user item" sequences, leave-one-out split (user-level examples).
from tfdp_embed.data.sequences import SequenceData, SequenceFormatError, load_sequences

# Poisson batches over users (user-level DP): each sampled user's <= k rows packed [users, k, ...].
from tfdp_embed.data.user_batches import poisson_user_batches

__all__ = [
    "CRITEO_VOCAB_SIZES",
    "BatchingInfo",
    "CriteoFormatError",
    "CriteoReadStats",
    "FedBatching",
    "MovieLensData",
    "MovieLensFormatError",
    "SequenceData",
    "SequenceFormatError",
    "SpillStats",
    "beam_poisson_batches",
    "criteo_dataset",
    "day_files",
    "embedding_dim",
    "fed_batching",
    "fixed_shape_batches",
    "fixed_size_batches",
    "load_movielens_data",
    "load_sequences",
    "one_pass_poisson_batches",
    "parse_raw_fields",
    "poisson_batches",
    "poisson_user_batches",
    "read_item_genres",
    "read_manifest",
    "read_ratings",
    "running_counts",
    "streaming_periods",
    "streaming_poisson_batches",
    "table_sizes",
    "with_lookahead",
    "write_synthetic_criteo",
]
