"""The README's usage example runs as written (export path redirected to a temp dir) and its model learns."""

import math
import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(tmp_path):
    text = README.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert "saved_models/readme_example" in code
    code = code.replace("saved_models/readme_example", str(tmp_path / "model"))
    code = code.replace("dp.fit(batches, epochs=epochs,", "dp.fit(batches, epochs=epochs, verbose=0,")
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - our own README
    assert 0 < namespace["report"]["epsilon"] <= 3.0
    assert (tmp_path / "model" / "privacy_report.json").exists()
    # The loss falls well below the base rate's (issue 34: the old example's labels could not be learned).
    labels, logits = namespace["labels"], namespace["model"].predict(namespace["ids"], verbose=0)
    p = float(labels.mean())
    base_rate_loss = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    loss = float(np.mean(np.logaddexp(0.0, logits) - labels * logits))  # binary cross-entropy from logits
    assert loss < 0.8 * base_rate_loss, (loss, base_rate_loss)
