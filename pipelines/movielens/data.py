"""The MovieLens ratings read and split, the training pool (plus extra examples) and its Poisson batches."""

from __future__ import annotations

import dataclasses

import numpy as np

from pipelines import input_files
from pipelines.movielens import vocabulary as movielens_vocabulary
from pipelines.movielens.config import (
    MovieLensConfig,
)
from tfdp_embed import tf
from tfdp_embed.data import poisson_batches, with_lookahead
from tfdp_embed.data.movielens import (
    PADDING_ID,
    MovieLensData,
    load_movielens_data,
    read_ratings,
)
from tfdp_embed.data.movielens_files import resolve_ratings_path


def load_movielens(config: MovieLensConfig) -> MovieLensData:
    """Reads and splits the ratings of `config.data_path` (see `tfdp_embed.data.movielens`).

    Raises:
      FileNotFoundError, MovieLensFormatError: unreadable input (file and line named).
      InputFileError: a ratings file that is not text (binary; file, line and column named).
    """
    # a UTF-8 BOM is read as such (`read_ratings`); binary garbage is refused here naming the line
    input_files.check_text(resolve_ratings_path(config.data_path), what="MovieLens ratings lines")
    ids, release = None, None
    if movielens_vocabulary.needs_release(config, read_ratings(config.data_path).path):
        ids, release = movielens_vocabulary.dp_movie_ids(config, config.data_path)  # no catalogue: DP movie ids
    data = load_movielens_data(
        config.data_path,
        context_length=config.context_length,
        test_fraction=config.test_fraction,
        split_seed=config.split_seed,
        catalogue=config.item_catalogue,
        item_ids=ids,
    )
    return dataclasses.replace(data, item_release=release)


def check_examples(contexts, labels, num_items: int, what: str) -> tuple:
    contexts, labels = np.asarray(contexts), np.asarray(labels)
    if contexts.ndim != 2 or labels.ndim != 1 or contexts.shape[0] != labels.shape[0]:
        raise ValueError(
            f"`{what}` takes contexts [n, context_length] and labels [n]; received shapes {contexts.shape} "
            f"and {labels.shape}."
        )
    if contexts.dtype.kind not in "iu" or labels.dtype.kind not in "iu":
        raise ValueError(f"`{what}`: contexts and labels must be integer item ids (0 = padding in contexts).")
    if contexts.size and (contexts.min() < 0 or contexts.max() > num_items):
        raise ValueError(f"`{what}`: context ids must lie in [0, {num_items}] (0 = padding).")
    if labels.size and (labels.min() < 1 or labels.max() > num_items):
        raise ValueError(f"`{what}`: labels must be item ids in [1, {num_items}].")
    if contexts.size and not np.all(np.any(contexts != PADDING_ID, axis=1)):
        raise ValueError(f"`{what}`: every context needs at least one item id (a row holds only padding).")
    return contexts.astype(np.int32), labels.astype(np.int32)


def training_pool(data: MovieLensData, extra) -> tuple:
    contexts, labels = data.train_contexts, data.train_labels
    if extra is None:
        return contexts, labels, 0
    if not isinstance(extra, (tuple, list)) or len(extra) != 2:
        raise ValueError("`extra_train_examples` must be a pair (contexts [n, context_length], labels [n]).")
    extra_contexts, extra_labels = check_examples(extra[0], extra[1], data.num_items, "extra_train_examples")
    if extra_contexts.shape[1] != data.context_length:
        raise ValueError(
            f"`extra_train_examples` contexts must have context_length {data.context_length} columns; "
            f"received {extra_contexts.shape[1]}."
        )
    return (
        np.concatenate([contexts, extra_contexts]),
        np.concatenate([labels, extra_labels]),
        len(extra_labels),
    )


def counted_batches(contexts, labels, *, q, seed, lookahead: bool, counter, table_name: str):
    """Poisson batches; each batch the model trains on is recorded in `counter` (per epoch).

    The count is a `map` over the sampler's batches (a pass-through step), so
    `DPModel.fit` still sees the Poisson sampler it was fed.
    """
    pool = tf.data.Dataset.from_tensor_slices((contexts.astype(np.int32), labels.astype(np.int32)))
    batches, info = poisson_batches(pool, sampling_probability=q, seed=seed, num_examples=len(labels))
    counter.batches_per_epoch = info.batches_per_epoch
    return counted_dataset(batches, counter, lookahead=lookahead, table_name=table_name), info


def counted_dataset(batches, counter, *, lookahead: bool, table_name: str):
    """`(contexts, labels)` of each batch, its contexts recorded in `counter`; any further element (a user-level
    batch's sample weight) is dropped; LazyDP's lookahead on `table_name` when asked."""

    def record(batch_contexts):
        counter.record(batch_contexts)
        return np.int64(0)

    def counted(batch_contexts, batch_labels, *_rest):
        done = tf.numpy_function(record, [batch_contexts], tf.int64, stateful=True)
        with tf.control_dependencies([done]):
            return tf.identity(batch_contexts), tf.identity(batch_labels)

    dataset = batches.map(counted)
    if lookahead:
        dataset = with_lookahead(dataset, lambda features: {table_name: features})
    return dataset
