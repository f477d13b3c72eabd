"""Item frequencies: Gaussian / Laplace count release, public ones from a file, exact ones for non-private runs."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest

from tfdp_embed.accounting import compute_epsilon
from tfdp_embed.keras2.attention import (
    ItemFrequencyFileError,
    exact_item_frequencies,
    private_item_frequencies,
    public_item_frequencies,
    read_item_frequencies,
)


def test_public_frequencies():
    freq = public_item_frequencies(np.array([0, 5, 10, 0]), num_users=20)
    np.testing.assert_allclose(freq.frequencies, [0, 0.25, 0.5, 0])
    assert freq.event is None and freq.source == "public"
    exact = exact_item_frequencies(np.array([0, 5, 10, 0]), num_users=20)
    np.testing.assert_allclose(exact.frequencies, freq.frequencies)
    assert exact.source == "exact (not private)" and exact.event is None


def test_read_item_frequencies_file(tmp_path):
    path = tmp_path / "freq.txt"
    path.write_text("# item_id frequency\n\n3 0.5\n1\t0.125\n  4 1 \n")
    freq = read_item_frequencies(str(path), num_items=5)
    np.testing.assert_array_equal(freq.frequencies, [0, 0.125, 0, 0.5, 1.0, 0])  # unlisted items: 0
    assert freq.source == "public-file" and freq.path == str(path) and freq.event is None
    assert freq.report()["file"] == str(path)


@pytest.mark.parametrize(
    "text, message",
    [
        ("1 0.5\n2\n", ":2: expected 2 fields 'item_id frequency', found 1"),
        ("1 0.5 7\n", ":1: expected 2 fields"),
        ("x 0.5\n", ":1: item_id must be an integer; received 'x'"),
        ("1 half\n", ":1: frequency must be a number; received 'half'"),
        ("# c\n6 0.5\n", ":2: item_id must lie in [1, 5]"),
        ("0 0.5\n", ":1: item_id must lie in [1, 5]"),
        ("1 1.5\n", ":1: frequency must lie in [0, 1]"),
        ("1 nan\n", ":1: frequency must lie in [0, 1]"),
        ("1 -0.1\n", ":1: frequency must lie in [0, 1]"),
        ("1 0.5\n1 0.2\n", ":2: item 1 already given on line 1"),
        ("# only a comment\n", ": the file lists no items"),
    ],
)
def test_read_item_frequencies_rejects_bad_files(tmp_path, text, message):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(ItemFrequencyFileError) as error:
        read_item_frequencies(str(path), num_items=5)
    assert f"{path}{message}" in str(error.value)


def test_read_item_frequencies_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        read_item_frequencies(str(tmp_path / "missing.txt"), num_items=5)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_private_noise_std_matches_formula(mechanism):
    counts = np.full(200_001, 5_000)
    counts[0] = 0
    freq = private_item_frequencies(
        counts, num_users=10_000, max_items_per_user=16, noise_multiplier=3.0, mechanism=mechanism, seed=0
    )
    # Gaussian std z sqrt(L) = 3 * 4 = 12; Laplace scale z L = 48, std 48 sqrt(2)
    expected = 12.0 if mechanism == "gaussian" else 48.0 * np.sqrt(2)
    assert freq.noise_std == pytest.approx(expected)
    assert freq.sensitivity == pytest.approx(4.0 if mechanism == "gaussian" else 16.0)  # sqrt(L) (L2), L (L1)
    noisy_counts = freq.frequencies[1:] * 10_000
    assert noisy_counts.std() == pytest.approx(expected, rel=0.01)
    assert noisy_counts.mean() == pytest.approx(5_000, abs=0.5)
    event_type = dp_accounting.GaussianDpEvent if mechanism == "gaussian" else dp_accounting.LaplaceDpEvent
    assert isinstance(freq.event, event_type) and freq.frequencies[0] == 0


def test_private_release_is_accounted():
    freq = private_item_frequencies(np.array([0, 3]), num_users=5, max_items_per_user=4, noise_multiplier=20.0, seed=1)
    eps = compute_epsilon([freq.event], target_delta=1e-5, accountant="rdp")
    assert 0 < eps < 0.5  # a small epsilon for z = 20
    assert 0 <= freq.frequencies.min() and freq.frequencies.max() <= 1


def test_bad_input_rejected():
    with pytest.raises(ValueError, match="exceeds `num_users`"):
        public_item_frequencies(np.array([0, 9]), num_users=5)
    with pytest.raises(ValueError, match="`counts` must be"):
        public_item_frequencies(np.array([0, -1]), num_users=5)
    with pytest.raises(ValueError, match="`noise_multiplier`"):
        private_item_frequencies(np.array([0, 1]), num_users=5, max_items_per_user=2, noise_multiplier=0.0)
    with pytest.raises(ValueError, match="`mechanism`"):
        private_item_frequencies(
            np.array([0, 1]), num_users=5, max_items_per_user=2, noise_multiplier=1.0, mechanism="exp"
        )
    with pytest.raises(ValueError, match="`max_items_per_user`"):
        private_item_frequencies(np.array([0, 1]), num_users=5, max_items_per_user=0, noise_multiplier=1.0)
