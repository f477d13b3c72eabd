"""Exceptions for checkpoints that must not be loaded."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; nothing was loaded from it."""


class CheckpointCorruptedError(CheckpointError):
    """A checkpoint's files are missing, truncated or garbled (checksums differ from its manifest)."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint was written by another model, optimizer, mechanism or accounting setup."""


__all__ = ["CheckpointCorruptedError", "CheckpointError", "CheckpointMismatchError"]
