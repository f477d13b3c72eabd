"""Skips the tests marked `gpu` where TensorFlow sees no GPU."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    from tfdp_embed._keras import tf

    if tf.config.list_physical_devices("GPU"):
        return
    skip = pytest.mark.skip(reason="needs a GPU; TensorFlow sees none (the gpu tests run where one is visible)")
    for item in gpu_tests:
        item.add_marker(skip)
