"""The README's usage example runs as written (export path redirected to a temp dir)."""

import pathlib
import re

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
