"""The manifest beside each checkpoint: what wrote it, and checksums of its files.

A checkpoint `ckpt-N` (TensorFlow's `ckpt-N.index` + `ckpt-N.data-*`) is
complete only when `ckpt-N.manifest.json` exists: the manifest is written
after TensorFlow has finished the checkpoint, to a temporary file that is
then renamed (atomic on POSIX), so a run killed while saving leaves either
no manifest (the checkpoint is ignored) or a whole one.

The manifest holds

* `signature`: what must be equal to resume: the wrapped model's variables
  (short name, shape, dtype, in order), the optimizer's class, config and
  variables, the mechanism's class, hyperparameters and state variables,
  the accounting parameters (sampling probability, delta, accountant) and
  the data stream (batches per epoch, sampler seed) when known;
* `files`: size and SHA-256 of every checkpoint file, checked before anything
  is loaded (a truncated or garbled file, or a missing index, is refused);
* `progress`: step, epoch, batch in epoch, ledger steps, whether a lazy
  mechanism still owes noise; `library_version`, `tensorflow_version`.

Shapes are the variables' declared shapes (None for a dimension that may
grow, e.g. LazyDP's per-step sums). Variable names are reduced to their last
component ("kernel", "momentum") so that Keras' per-process layer numbering
("dense_1") does not make an identical model look different.

References: `tf.train.CheckpointManager` (checkpoint files and rotation).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np
import tensorflow as tf

from tfdp_embed.clipping.layer_kinds import tf_variable

FORMAT = "tfdp_embed.Checkpoint"
VERSION = 1
MANIFEST_SUFFIX = ".manifest.json"
_CHUNK = 1 << 20
# Mechanism attributes that never decide compatibility: the seed only picks the
# initial RNG state, which the checkpoint restores (except for stateless row noise).
_NOT_HYPERPARAMETERS = ("seed",)


def variable_descriptor(variable, *, with_name: bool = True) -> list:
    """[short name, shape (None for unknown dims), dtype] of a variable."""
    shape = variable.shape.as_list() if variable.shape.rank is not None else None
    dtype = variable.dtype.name
    if not with_name:
        return [shape, dtype]
    short = variable.name.split(":")[0].rsplit("/", 1)[-1]
    return [short, shape, dtype]


def _config_value(value):
    """Optimizer config values as plain JSON; floats at float32 precision.

    A legacy Keras optimizer reports `momentum` as the Python float it was
    given before its first step and as the float32 variable's value after.
    """
    if isinstance(value, dict):
        return {str(k): _config_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_config_value(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) or (isinstance(value, np.ndarray) and value.shape == ()):
        return float(np.float32(value))
    return _jsonable(value)


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return repr(value)


def mechanism_hyperparameters(mechanism) -> dict:
    """The mechanism's scalar public attributes (clip, noise multipliers, thresholds, ...)."""
    out: dict = {}
    for key, value in sorted(vars(mechanism).items()):
        if key.startswith("_") or key in _NOT_HYPERPARAMETERS:
            continue
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[key] = value
    if getattr(mechanism, "row_noise", None) == "stateless":
        out["seed"] = mechanism.seed  # stateless row noise is keyed by the seed itself
    top_k = getattr(mechanism, "top_k", None)
    if isinstance(top_k, dict):
        out["top_k"] = {str(k): int(v) for k, v in sorted(top_k.items())}
    return out


def describe_training_state(
    dp_model,
    *,
    budget=None,
    batches_per_epoch: int | None = None,
    sampler_seed: int | None = None,
) -> dict:
    """The signature of a prepared `DPModel`: everything that must match to resume.

    Args:
      dp_model: a `DPModel` whose model is built, mechanism initialised and
        optimizer variables created.
      budget: the `PrivacyBudget` whose ledger is checkpointed, or None.
      batches_per_epoch: Poisson batches per epoch (round(1/q)), if known.
      sampler_seed: the batch sampler's seed, if known.

    Returns:
      A JSON-able dict with keys model, optimizer, mechanism, accounting, data.
    """
    model_vars = [tf_variable(v) for v in dp_model.inner.weights]  # Keras 3: the tf.Variables inside
    optimizer = dp_model.optimizer
    optimizer_vars = [tf_variable(v) for v in optimizer_variables(optimizer)]
    owned = {v.ref() for v in model_vars} | {v.ref() for v in optimizer_vars}
    mechanism = dp_model.mechanism
    mechanism_vars = [v for v in mechanism.variables if v.ref() not in owned]
    generator_state = getattr(getattr(mechanism, "generator", None), "state", None)
    if generator_state is not None and generator_state.ref() not in {v.ref() for v in mechanism_vars}:
        mechanism_vars.append(generator_state)
    config = dict(optimizer.get_config())
    config.pop("name", None)
    learning_rate = config.pop("learning_rate", None)  # may be changed by callbacks; info only
    accounting = None
    if budget is not None:
        accounting = {
            "sampling_probability": float(budget.sampling_probability),
            "target_delta": float(budget.target_delta),
            "accountant": budget.accountant,
        }
    return {
        "model": {"variables": [variable_descriptor(v) for v in model_vars]},
        "optimizer": {
            "class": type(optimizer).__module__ + "." + type(optimizer).__qualname__,
            "config": _config_value(config),
            "variables": sorted((variable_descriptor(v) for v in optimizer_vars), key=json.dumps),
            "learning_rate_at_save": _config_value(learning_rate),
        },
        "mechanism": {
            "name": mechanism.name,
            "class": type(mechanism).__module__ + "." + type(mechanism).__qualname__,
            "is_dp": bool(mechanism.is_dp),
            "hyperparameters": mechanism_hyperparameters(mechanism),
            "variables": sorted(
                (variable_descriptor(v, with_name=False) for v in mechanism_vars),
                key=json.dumps,
            ),
        },
        "accounting": accounting,
        "data": {"batches_per_epoch": batches_per_epoch, "sampler_seed": sampler_seed},
    }


def optimizer_variables(optimizer) -> list:
    """The optimizer's variables (legacy `variables()` or new-style `variables` property)."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


# Keys whose values are information, not requirements.
_INFO_ONLY = {("optimizer", "learning_rate_at_save")}


def signature_differences(
    saved: dict,
    current: dict,
    *,
    only: tuple[str, str] | None = None,
    skip: tuple[str, str] | None = None,
) -> list[str]:
    """Human-readable differences between two `describe_training_state` results.

    `None` on either side of `accounting` or a `data` field means "unknown"
    and is not a difference. `only` / `skip`: one (section, key) to compare
    alone / to leave out.
    """
    problems = []
    for section in ("model", "optimizer", "mechanism", "accounting", "data"):
        old, new = saved.get(section), current.get(section)
        if section in ("accounting", "data") and (old is None or new is None):
            continue
        for key in sorted(set(old or {}) | set(new or {})):
            if (section, key) in _INFO_ONLY or (section, key) == skip or (only and (section, key) != only):
                continue
            a, b = (old or {}).get(key), (new or {}).get(key)
            if section == "data" and (a is None or b is None):
                continue
            if a != b:
                problems.append(f"{section}.{key}: checkpoint has {_short(a)}, this run has {_short(b)}")
    return problems


def _short(value, limit: int = 300) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- files ------------------------------------------------------------------------


def checkpoint_files(prefix: str) -> list[str]:
    """The files TensorFlow wrote for checkpoint `prefix` (index + data shards), sorted."""
    directory, base = os.path.split(prefix)
    names = [
        name for name in os.listdir(directory or ".") if name == base + ".index" or name.startswith(base + ".data-")
    ]
    return sorted(names)


def file_digest(path: str) -> str:
    """SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def describe_files(prefix: str) -> dict:
    """{file name: {"bytes": size, "sha256": digest}} for every file of checkpoint `prefix`."""
    directory = os.path.dirname(prefix)
    out = {}
    for name in checkpoint_files(prefix):
        path = os.path.join(directory, name)
        out[name] = {"bytes": os.path.getsize(path), "sha256": file_digest(path)}
    return out


def file_problems(prefix: str, files: dict) -> list[str]:
    """What is wrong with checkpoint `prefix`'s files compared with the manifest's `files`."""
    directory = os.path.dirname(prefix)
    problems = []
    if not any(name.endswith(".index") for name in files):
        problems.append("the manifest lists no .index file")
    for name, expected in sorted(files.items()):
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            problems.append(f"{name} is missing")
            continue
        size = os.path.getsize(path)
        if size != expected["bytes"]:
            problems.append(f"{name} has {size} bytes, the manifest says {expected['bytes']} (truncated or extended)")
        elif file_digest(path) != expected["sha256"]:
            problems.append(f"{name} has a different SHA-256 than the manifest records (garbled)")
    return problems


# -- manifest files ---------------------------------------------------------------


def manifest_path(prefix: str) -> str:
    """`<prefix>.manifest.json`."""
    return prefix + MANIFEST_SUFFIX


def write_manifest(prefix: str, manifest: dict) -> str:
    """Writes the manifest atomically (temporary file, fsync, rename); returns its path."""
    path = manifest_path(prefix)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(
            {"format": FORMAT, "version": VERSION, **manifest},
            f,
            indent=1,
            sort_keys=True,
        )
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_manifest(path: str) -> dict[str, Any]:
    """Reads a manifest written by `write_manifest`.

    Raises:
      CheckpointCorruptedError: unreadable JSON or not a tfdp_embed manifest.
    """
    from tfdp_embed.checkpointing.errors import CheckpointCorruptedError

    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as error:
        raise CheckpointCorruptedError(
            f"Checkpoint manifest {path} cannot be read ({error}); nothing was loaded."
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointCorruptedError(f"{path} is not a {FORMAT} manifest; nothing was loaded.")
    if data.get("version") != VERSION:
        raise CheckpointCorruptedError(
            f"{path} has manifest version {data.get('version')!r}; this library reads version {VERSION}."
        )
    for key in ("checkpoint", "signature", "files", "progress"):
        if key not in data:
            raise CheckpointCorruptedError(f"Checkpoint manifest {path} lacks `{key}`; nothing was loaded.")
    return data


def tensorflow_version() -> str:
    return tf.__version__


__all__ = [
    "FORMAT",
    "MANIFEST_SUFFIX",
    "VERSION",
    "checkpoint_files",
    "describe_files",
    "describe_training_state",
    "file_digest",
    "file_problems",
    "manifest_path",
    "mechanism_hyperparameters",
    "optimizer_variables",
    "read_manifest",
    "signature_differences",
    "tensorflow_version",
    "variable_descriptor",
    "write_manifest",
]
