import json
import types

from benchmarks import outputs


def test_write_run_writes_what_is_set_and_names_the_files(tmp_path):
    page, doc, png = tmp_path / "RESULTS.md", tmp_path / "run.json", tmp_path / "run.png"
    drawn = []
    args = types.SimpleNamespace(json=str(doc), png=str(png), results_md=str(page))
    outputs.write_run(
        args, {"a": 1}, plot=drawn.append, section=lambda png, json_path: f"## run\n\nplot {png}, data {json_path}\n"
    )
    assert json.loads(doc.read_text()) == {"a": 1}
    assert drawn == [str(png)]
    text = page.read_text()
    assert "### run" in text and f"plot {png}" in text and f"data {doc}" in text


def test_write_run_skips_what_is_not_set(tmp_path):
    args = types.SimpleNamespace(json="", png="", results_md=str(tmp_path / "R.md"))
    outputs.write_run(args, {}, plot=lambda path: 1 / 0, section=lambda **paths: f"## x\n\n{paths}\n")
    assert "'png': 'not written', 'json_path': 'not written'" in (tmp_path / "R.md").read_text()
