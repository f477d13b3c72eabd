"""`tfdp_embed.mechanisms.create`: the one factory by name; `MECHANISMS` is exactly name -> class."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest

from tfdp_embed import mechanisms
from tfdp_embed.mechanisms import MECHANISMS, NoiseMechanism, create, factory

COUNTS = {"t": np.arange(50, dtype=np.int64)}
NOISE = dict(l2_norm_clip=1.0, noise_multiplier=1.1, seed=0)
OPTIONS = {
    "none": dict(seed=0),
    "dense": NOISE,
    "lazy": NOISE,
    "eana": NOISE,
    "fest": dict(NOISE, selection_epsilon=0.1, top_k=3, counts=COUNTS),
    "adafest": dict(NOISE, contribution_clip=1.0, contribution_noise_multiplier=2.0, threshold=8.0),
    "adafest+": dict(
        NOISE,
        contribution_clip=1.0,
        contribution_noise_multiplier=2.0,
        threshold=8.0,
        selection_epsilon=0.1,
        top_k={"t": 3},
        counts=COUNTS,
    ),
}


def test_mechanisms_maps_each_name_to_its_class_only():
    assert sorted(MECHANISMS) == sorted(OPTIONS)
    assert all(isinstance(cls, type) and issubclass(cls, NoiseMechanism) for cls in MECHANISMS.values())
    assert {name for name, cls in MECHANISMS.items() if cls.is_dp} == {"dense", "lazy", "fest", "adafest", "adafest+"}
    assert all(cls.name == name for name, cls in MECHANISMS.items())


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_create_builds_the_registered_class(name):
    mechanism = create(name, **OPTIONS[name])
    assert type(mechanism) is MECHANISMS[name]
    if name != "none":
        assert mechanism.l2_norm_clip == 1.0 and mechanism.noise_multiplier == 1.1


def test_adafest_plus_from_counts_selects_and_records_the_selection():
    mechanism = create("adafest+", **dict(OPTIONS["adafest+"], top_k=None, top_fraction=0.1))
    assert len(mechanism._selected_rows["t"]) == 5 and mechanism.selection_epsilon == pytest.approx(0.1)
    assert isinstance(mechanism.setup_event(), dp_accounting.GaussianDpEvent)
    assert "selection_epsilon" in mechanisms.options("adafest+", counts=True)
    assert "selected_rows" in mechanisms.options("adafest+") and "counts" not in mechanisms.options("adafest+")


def test_errors_name_what_is_allowed():
    with pytest.raises(ValueError, match=r"`mechanism` must be one of \['adafest', 'adafest\+', 'dense'"):
        create("dp-sgd", **NOISE)
    with pytest.raises(ValueError, match=r"takes no option\(s\) \['top_k'\]; allowed: \['l2_norm_clip'"):
        create("dense", top_k=3, **NOISE)
    with pytest.raises(ValueError, match=r"'none' \(NonPrivate\) takes no option\(s\) \['l2_norm_clip'"):
        create("none", l2_norm_clip=1.0)
    with pytest.raises(ValueError, match=r"needs \['contribution_noise_multiplier', 'threshold'\]"):
        create("adafest", contribution_clip=1.0, **NOISE)
    with pytest.raises(ValueError, match=r"needs \['noise_multiplier'\]"):
        create("dense", l2_norm_clip=1.0)
    with pytest.raises(ValueError, match="exactly one of `top_k`"):
        create("adafest+", **dict(OPTIONS["adafest+"], top_fraction=0.1))


class _TinyDense(mechanisms.DenseDPSGD):
    name = "tiny_dense"


@pytest.fixture
def registry():
    """The registry as it was before the test (a registered name must not leak into other tests)."""
    saved = dict(factory._REGISTRY)
    yield
    factory._REGISTRY.clear()
    factory._REGISTRY.update(saved)


def test_register_mechanism_makes_create_build_a_users_class(registry):
    assert mechanisms.register_mechanism("tiny_dense", _TinyDense) is _TinyDense
    mechanism = create("tiny_dense", **NOISE)
    assert type(mechanism) is _TinyDense and MECHANISMS["tiny_dense"] is _TinyDense
    assert mechanism.l2_norm_clip == 1.0 and mechanism.noise_multiplier == 1.1
    mechanisms.register_mechanism("tiny_dense", _TinyDense)  # the same class again: nothing to refuse


def test_register_mechanism_refuses_duplicates_and_non_mechanisms(registry):
    class Dense(mechanisms.DenseDPSGD):  # name "dense", inherited
        pass

    with pytest.raises(ValueError, match=r"'dense' is taken by DenseDPSGD; pass `replace=True`"):
        mechanisms.register_mechanism("dense", Dense)
    mechanisms.register_mechanism("dense", Dense, replace=True)
    assert MECHANISMS["dense"] is Dense
    with pytest.raises(ValueError, match=r"`name` must be the class's `name` \('tiny_dense'\); received 'other'"):
        mechanisms.register_mechanism("other", _TinyDense)

    class Undeclared(NoiseMechanism):
        name = "undeclared"

        def update(self, clipped):
            return []

        def step_event(self):
            return None

    with pytest.raises(TypeError, match="does not declare `capabilities`"):
        mechanisms.register_mechanism("undeclared", Undeclared)
    for not_a_mechanism in (dict, "dense", _TinyDense(**NOISE)):
        with pytest.raises(TypeError, match="must be a concrete subclass of tfdp_embed.mechanisms.NoiseMechanism"):
            mechanisms.register_mechanism("tiny_dense", not_a_mechanism)
    assert "undeclared" not in MECHANISMS and "tiny_dense" not in MECHANISMS


def test_mechanisms_is_read_only():
    with pytest.raises(TypeError):
        MECHANISMS["mine"] = _TinyDense  # type: ignore[index]
    assert "mine" not in MECHANISMS
