"""The core is Keras-free; the front ends (`tfdp_embed.keras2`, `tfdp_embed.keras3`) are reached only through bridges.

Core: every module of `tfdp_embed` outside the front-end packages. It imports
no `keras`, `tf_keras`, `tensorflow_recommenders` or front end (at any depth,
function-level imports too) and never touches `tf.keras`. The bridges:
`tfdp_embed/front_end.py` (importlib by string), the lazy names of
`tfdp_embed/__init__.py`, and `tfdp_embed/clipping/layer_kinds.py`, which
names the Keras packages only to look them up in `sys.modules` (it never
imports one: the fresh-process check below refuses any such import). Checked twice: statically (ast), and by
importing the whole core in a fresh process whose `tf.keras` is Keras 3 with
an import hook that refuses the front end. Also: every public module says
what it exports (`__all__`), and the TPU parts load only when asked for.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfdp_embed"
FRONT_ENDS = (PACKAGE / "keras2", PACKAGE / "keras3")
BRIDGES = {"tfdp_embed/front_end.py", "tfdp_embed/__init__.py", "tfdp_embed/clipping/layer_kinds.py"}
FORBIDDEN = ("keras", "tf_keras", "tensorflow_recommenders", "tfdp_embed.keras2", "tfdp_embed.keras3")
CORE_PACKAGES = ("mechanisms", "accounting", "planning", "data", "ops", "audit", "metrics", "clipping", "layers")


def _blocked(module: str, forbidden=FORBIDDEN) -> bool:
    return any(module == name or module.startswith(name + ".") for name in forbidden)


def keras_uses(path: pathlib.Path, front_end_names=()) -> list:
    """What in `path` reaches Keras: imports (any depth) of FORBIDDEN modules, `*.keras`, module-name strings."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if _blocked(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            lazy = {f"tfdp_embed.{name}" for name in front_end_names}
            found += [f"from-import {n}" for n in names if _blocked(n) or n in lazy]
        elif isinstance(node, ast.Attribute) and node.attr == "keras":
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if _blocked(node.value):  # a module name as a string (importlib)
                found.append(f"line {node.lineno}: string {node.value!r}")
    return found


def core_files() -> list:
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if not any(f in p.parents for f in FRONT_ENDS)]
    return [p for p in files if str(p.relative_to(ROOT)) not in BRIDGES]


def test_the_core_does_not_import_keras_or_the_front_end():
    import tfdp_embed  # Keras-free itself (checked in a fresh process below)

    front_end_names = set(tfdp_embed._FRONT_END)
    files = core_files()
    assert len(files) > 50
    bad = {str(p.relative_to(ROOT)): hits for p in files if (hits := keras_uses(p, front_end_names))}
    assert bad == {}, "core modules reaching Keras or the front end"


def test_the_static_check_sees_what_it_must(tmp_path):
    source = tmp_path / "x.py"
    cases = {
        "def f():\n    import tf_keras\n": "import tf_keras",
        "from tfdp_embed.keras2.layers import embedding\n": "from-import tfdp_embed.keras2.layers",
        "from tfdp_embed import keras2\n": "from-import tfdp_embed.keras2",
        "from tfdp_embed import DPModel\n": "from-import tfdp_embed.DPModel",
        "import tensorflow as tf\nLayer = tf.keras.layers.Layer\n": "line 2: tf.keras",
        "import importlib\nimportlib.import_module('tensorflow_recommenders')\n": "string 'tensorflow_recommenders'",
    }
    for code, expected in cases.items():
        source.write_text(code)
        assert any(expected in hit for hit in keras_uses(source, {"DPModel"})), code
    source.write_text('"""Mentions tfdp_embed.keras2 and keras in prose."""\nimport tensorflow as tf\n')
    assert keras_uses(source, {"DPModel"}) == []


def _run(script: str) -> dict:
    """Runs `script` in a fresh Python with `tf.keras` left to TensorFlow's default (Keras 3); its last line is JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    noise = ("I0000", "WARNING: All log messages before absl")  # TensorFlow's start-up lines
    stderr = "\n".join(line for line in done.stderr.splitlines() if not line.startswith(noise))
    assert done.returncode == 0, stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CORE_UNDER_KERAS_3 = """
    import importlib, importlib.abc, json, os, pkgutil, sys

    import keras  # the user's Keras 3, loaded before tfdp_embed

    class RefuseFrontEnd(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in ("tf_keras", "tensorflow_recommenders",
                                                                     "tfdp_embed.keras2", "tfdp_embed.keras3")):
                raise ImportError(f"the core imported {name}")
            return None

    sys.meta_path.insert(0, RefuseFrontEnd())
    import tfdp_embed

    loaded = ["tfdp_embed"]
    for info in pkgutil.iter_modules(tfdp_embed.__path__, "tfdp_embed."):
        if info.name in ("tfdp_embed.keras2", "tfdp_embed.keras3"):
            continue
        module = importlib.import_module(info.name)
        loaded.append(info.name)
        if info.ispkg:
            for sub in pkgutil.walk_packages(module.__path__, info.name + "."):
                importlib.import_module(sub.name)
                loaded.append(sub.name)
    env = os.environ.get("TF_USE_LEGACY_KERAS")
    import tensorflow as tf

    try:
        same = tf.keras.layers.Layer is keras.layers.Layer
    except ImportError as error:  # tf.keras switched to tf-keras, which the hook refuses
        same = repr(error)
    print(json.dumps({
        "loaded": loaded,
        "keras": keras.__version__,
        "env": env,
        "tf_keras_is_keras_3": same,
        "front_end_modules": sorted(m for m in sys.modules if m.startswith(("tf_keras", "tfdp_embed.keras2"))),
    }))
"""


def test_the_core_imports_under_keras_3_and_leaves_it_alone():
    facts = _run(CORE_UNDER_KERAS_3)
    assert facts["keras"].startswith("3.")
    assert {f"tfdp_embed.{name}" for name in CORE_PACKAGES} <= set(facts["loaded"])
    assert "tfdp_embed.mechanisms.lazy" in facts["loaded"] and "tfdp_embed.data.criteo.reader" in facts["loaded"]
    assert facts["env"] is None  # importing the core set no TF_USE_LEGACY_KERAS
    assert facts["tf_keras_is_keras_3"] is True  # the user's tf.keras is still their Keras 3
    assert facts["front_end_modules"] == []


FRONT_END_FROM_THE_PACKAGE = """
    import json, sys

    from tfdp_embed import DPModel, keras
    from tfdp_embed import DPEmbedding, mechanisms

    tpu_on_import = sorted(m for m in sys.modules if m.startswith("tfdp_embed.keras2.distribute.tpu"))
    layer = DPEmbedding(10, 4, name="t")
    layer.build(None)
    lazy = mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    lazy.init(tables=[layer], dense_variables=[], optimizer=keras.optimizers.legacy.SGD(0.1))
    from tfdp_embed.keras2.distribute import TpuDPStep

    print(json.dumps({
        "keras": keras.__version__,
        "keras_module": keras.__name__,
        "dp_model_is_a_keras_model": issubclass(DPModel, keras.Model),
        "table_shape": layer.embeddings.shape.as_list(),
        "tables": len(lazy._tables),
        "tpu_on_import": tpu_on_import,
        "tpu_step": TpuDPStep.__module__,
    }))
"""


@pytest.fixture(scope="module")
def front_end():
    return _run(FRONT_END_FROM_THE_PACKAGE)


def test_the_front_end_still_gives_tf_keras(front_end):
    assert front_end["keras"].startswith("2.") and front_end["keras_module"].startswith("tf_keras")
    assert front_end["dp_model_is_a_keras_model"]
    assert front_end["table_shape"] == [10, 4] and front_end["tables"] == 1  # LazyDP.init on a legacy SGD


def test_tpu_code_loads_only_when_asked_for(front_end):
    assert front_end["tpu_on_import"] == []
    assert front_end["tpu_step"] == "tfdp_embed.keras2.distribute.tpu_step"


def public_modules() -> list:
    """Dotted names of every module of tfdp_embed whose path has no part starting with `_`."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if not any(part.startswith("_") for part in parts):
            names.append(".".join(parts))
    return names


def _defines_all(name: str) -> bool:
    path = ROOT / (name.replace(".", "/") + ".py")
    path = path if path.exists() else ROOT / name.replace(".", "/") / "__init__.py"
    tree = ast.parse(path.read_text())
    targets = [t for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    targets += [node.target for node in tree.body if isinstance(node, ast.AnnAssign)]
    return any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)


def test_every_public_module_says_what_it_exports():
    from tfdp_embed import keras2  # noqa: F401  (selects tf-keras before any front-end module loads)

    modules = public_modules()
    assert len(modules) > 150
    assert [name for name in modules if not _defines_all(name)] == []
    missing = {}
    for name in modules:
        module = importlib.import_module(name)
        absent = [
            n for n in module.__all__ if not hasattr(module, n) and importlib.util.find_spec(f"{name}.{n}") is None
        ]
        if absent:
            missing[name] = absent
    assert missing == {}, f"names in __all__ that the module does not define: {missing}"
