"""One example per user, declared by the caller (a sequence per user): the report states the user unit, k = 1."""

from __future__ import annotations

from tfdp_embed.accounting import format_report, privacy_report
from tfdp_embed.mechanisms import DenseDPSGD


def _report(**unit):
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=1)
    return privacy_report(
        mechanism=mechanism, delta=1e-5, sampling_probability=0.01, dataset_size=500, batching="poisson",
        steps=100, accountant="rdp", **unit,
    )  # fmt: skip


def test_a_declared_user_unit_is_stated_with_one_example_per_user_and_user_adjacency():
    report = _report(privacy_unit="user")
    assert report["privacy_unit"] == "user" and report["max_examples_per_unit"] == 1 and report["num_units"] == 500
    assert report["adjacency"] == "add-or-remove-one-user" and "add-or-remove-one-user" in report["guarantee"]
    assert "one row per user" in report["unit_declared_by_caller"]
    assert "500 users, one example each" in format_report(report)
    assert report["epsilon"] == _report()["epsilon"]  # the same accounting: only the unit's name changes


def test_the_default_unit_stays_one_example():
    report = _report()
    assert report["adjacency"] == "add-or-remove-one-example" and "max_examples_per_unit" not in report
