"""export_saved_model: flush first, no DP machinery inside, report beside, fresh-process reload."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.export import REPORT_FILENAME, export_saved_model
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms.dense import DenseDPSGD


def _trained(mechanism):
    keras.utils.set_random_seed(0)
    inp = keras.Input((3,), dtype="int32", name="ids")
    x = DPEmbedding(20, 4, combiner="mean")(inp)
    model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(8, "relu")(x)))
    rng = np.random.default_rng(0)
    ds = tf.data.Dataset.from_tensor_slices(
        (rng.integers(0, 20, (32, 3)).astype("int32"), rng.integers(0, 2, (32, 1)).astype("float32"))
    ).batch(8)
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=8)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=keras.losses.BinaryCrossentropy())
    dp.fit(ds, epochs=1, verbose=0)
    return dp


class _OwesForever(DenseDPSGD):
    """A broken lazy mechanism: flush() does not pay what it owes."""

    def owes_noise(self) -> bool:
        return True


def test_export_reloads_in_fresh_process_and_writes_report(tmp_path):
    dp = _trained(DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=0.5, seed=0))
    ids = np.array([[1, 2, 3], [4, 4, 19]], dtype="int32")
    expected = dp.inner(ids).numpy()
    path = str(tmp_path / "model")
    export_saved_model(dp, path, report={"epsilon": 1.5, "mechanism": "dense"})
    assert json.load(open(f"{path}/{REPORT_FILENAME}"))["epsilon"] == 1.5
    code = (
        "import sys, json, numpy as np, tensorflow as tf\n"
        f"m = tf.saved_model.load({path!r})\n"
        "f = m.signatures['serving_default']\n"
        "out = f(ids=tf.constant([[1, 2, 3], [4, 4, 19]], tf.int32))\n"
        "print(json.dumps(list(out.values())[0].numpy().ravel().tolist()))\n"
        "names = {v.name for v in m.variables}\n"
        "assert not any('generator' in n or 'steps' in n or 'momentum' in n for n in names), names\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    got = np.array(json.loads(result.stdout.strip().splitlines()[-1]))
    np.testing.assert_allclose(got, expected.ravel(), rtol=1e-5)


def test_export_refuses_a_model_that_still_owes_noise(tmp_path):
    dp = _trained(_OwesForever(l2_norm_clip=1.0, noise_multiplier=0.5, seed=0))
    with pytest.raises(PrivacyContractError, match="owes noise"):
        export_saved_model(dp, str(tmp_path / "model"))
    with pytest.raises(PrivacyContractError, match="owes noise"):
        dp.save_weights(str(tmp_path / "weights"))
