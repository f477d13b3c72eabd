"""Where the fused ops may run: their kernels are CPU kernels.

On a machine without an accelerator every fused op runs. Where a GPU or TPU
is visible, a fused op runs only on variables that all live on the CPU (a
parameter-server table, a table placed with `tf.device("/CPU:0")`); otherwise
the stock TensorFlow reference runs, whose ops have accelerator kernels, so a
table on the GPU neither pays host-device copies every step nor hands a GPU
resource handle to a CPU kernel. The references compute the same values
(bit for bit, see each op's docstring), so placement never changes a result
beyond the documented float32 summation order of `dense_ghost_norms`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import tensorflow as tf

ACCELERATORS = ("GPU", "TPU")


@functools.lru_cache(maxsize=1)
def accelerator_visible() -> bool:
    """True when TensorFlow sees a GPU or TPU (read once per process)."""
    return any(tf.config.list_physical_devices(kind) for kind in ACCELERATORS)


def on_cpu(device: str) -> bool:
    """True for a device string naming a CPU (`/job:.../device:CPU:0`, `/CPU:0`)."""
    return "CPU:" in device.upper()


def fused_allowed(*, accelerator: bool, devices: Sequence[str]) -> bool:
    """Whether the CPU kernels may run on variables placed on `devices`.

    Args:
      accelerator: whether a GPU or TPU is visible.
      devices: the device strings of the variables the op reads or writes;
        empty for ops on tensors only, which then follow TensorFlow's default
        placement (the accelerator) through the reference.
    """
    if not accelerator:
        return True
    return bool(devices) and all(on_cpu(d) for d in devices)


def fused_allowed_for(variables: Sequence = ()) -> bool:
    """`fused_allowed` for this process and these variables."""
    return fused_allowed(accelerator=accelerator_visible(), devices=[v.device for v in variables])


__all__ = ["ACCELERATORS", "accelerator_visible", "fused_allowed", "fused_allowed_for", "on_cpu"]
