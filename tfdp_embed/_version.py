"""The package version: the one source, read by setup.cfg (`attr:`) without importing TensorFlow."""

__version__ = "0.1.0"
