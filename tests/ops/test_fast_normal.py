"""The fast Gaussian op: exactness against a float64 reference, distribution, independence, API.

The reference (numpy): Philox4x32-10 in uint64 arithmetic, checked against
TensorFlow's own Philox (StatelessRandomUniformFullIntV2), then the
Box-Muller transform in float64 with exact octant reduction. The op's
outputs must agree within 4 float32 ulp (measured max 3.47 ulp over 1.3e8
outputs with ulp_check.cc; see tfdp_embed/ops/README.md).

Statistical tolerances are 5 standard errors (fixed keys: deterministic).
Tests that need the op skip only when there is no C++ compiler; a compiler
that fails to build the op is a failure.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tfdp_embed.keras2._keras import tf
from tfdp_embed.ops import fast_normal

REPO = Path(__file__).resolve().parents[2]
MASK32 = 0xFFFFFFFF

needs_op = pytest.mark.skipif(fast_normal.compiler() is None, reason="no C++ compiler: the op cannot be built")


@pytest.fixture(scope="module")
def op():
    if fast_normal.compiler() is None:
        pytest.skip("no C++ compiler")
    assert fast_normal.available(), fast_normal.unavailable_reason()
    return fast_normal.fast_normal


def draw(shape, key, stddev=1.0, isa="auto"):
    return fast_normal.fast_normal(shape, tf.constant(key, tf.int64), stddev, isa=isa).numpy()


# ----------------------------------------------------------------------------
# float64 reference
# ----------------------------------------------------------------------------
def philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint64 arrays holding uint32 values (Random123 semantics)."""
    c0, c1, c2, c3 = (np.asarray(c, np.uint64) for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0), np.uint64(k1)
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        p0, p1 = c0 * m0, c2 * m1
        c0, c1, c2, c3 = (
            (p1 >> np.uint64(32)) ^ c1 ^ k0,
            p1 & np.uint64(MASK32),
            (p0 >> np.uint64(32)) ^ c3 ^ k1,
            p0 & np.uint64(MASK32),
        )
        k0 = np.uint64((int(k0) + 0x9E3779B9) & MASK32)
        k1 = np.uint64((int(k1) + 0xBB67AE85) & MASK32)
    return c0, c1, c2, c3


def stream_words(key0, key1, blocks):
    b = np.arange(blocks, dtype=np.uint64)
    return philox(b & np.uint64(MASK32), b >> np.uint64(32), key1 & MASK32, key1 >> 32, key0 & MASK32, key0 >> 32)


def ref_log_u(w):
    w = w.astype(np.float64)
    return np.where(w >= 2.0**31, np.log1p(-((2.0**32 - 1 - w) + 0.5) * 2.0**-32), np.log((w + 0.5) * 2.0**-32))


def ref_cos_sin(w):
    """cos, sin of 2 pi (w + 1/2) / 2^32 with the octant reduced exactly."""
    w = w.astype(np.uint64)
    octant = w >> np.uint64(29)
    odd = (octant & np.uint64(1)).astype(bool)
    low = np.where(odd, ~w, w) & np.uint64(0x1FFFFFFF)
    t = (low.astype(np.float64) + 0.5) * 2.0**-29 * (np.pi / 4)
    st, ct = np.sin(t), np.cos(t)
    k = (octant + np.uint64(1)) >> np.uint64(1)
    swap = (k & np.uint64(1)).astype(bool)
    neg = np.where((k & np.uint64(2)).astype(bool), -1.0, 1.0)
    signed_st = np.where(odd, -st, st)
    c = np.where(swap, -signed_st, ct) * neg
    s = np.where(swap, ct, signed_st) * neg
    return c, s


def reference(key0, key1, n):
    """float64 N(0, 1) the op should return for key (key0, key1), n outputs (no end-cell words)."""
    chunks = -(-n // 64)
    w = stream_words(key0, key1, chunks * 16)
    out = np.empty(chunks * 64)
    lanes = np.arange(chunks * 16)
    base = (lanes // 16) * 64 + lanes % 16
    for pair in range(2):
        r = np.sqrt(-2.0 * ref_log_u(w[2 * pair]))
        c, s = ref_cos_sin(w[2 * pair + 1])
        out[base + 32 * pair] = r * c
        out[base + 32 * pair + 16] = r * s
    return out[:n], w


def ulp_error(got, want):
    _, e = np.frexp(np.abs(want))
    return np.abs(got.astype(np.float64) - want) / np.ldexp(1.0, np.maximum(e, -125) - 24)


# ----------------------------------------------------------------------------
# exactness
# ----------------------------------------------------------------------------
def test_numpy_philox_matches_tensorflows_philox():
    key0, key1 = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    tf_words = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[4 * 1000],
        key=tf.constant([key0], tf.uint64),
        counter=tf.constant([0, key1], tf.uint64),
        alg=1,  # Philox
        dtype=tf.uint32,
    ).numpy()
    ours = np.stack(stream_words(key0, key1, 1000), axis=1).reshape(-1)
    np.testing.assert_array_equal(ours, tf_words.astype(np.uint64))


@needs_op
def test_matches_float64_box_muller_within_4_ulp(op):
    key0, key1 = 0x0123456789ABCDEF, 0x0FEDCBA987654321
    n = 1 << 20
    got = draw([n], [key0, key1])
    want, w = reference(key0, key1, n)
    assert not np.any((w[0] == 0) | (w[0] == MASK32) | (w[2] == 0) | (w[2] == MASK32))
    err = ulp_error(got, want)
    assert err.max() <= 4.0, (err.max(), int(err.argmax()))
    assert np.median(err) <= 1.0


@needs_op
def test_loader_known_answers_are_the_reference(op):
    want, _ = reference(1, 2, 64)
    idx = list(fast_normal._KAT_INDICES)
    assert ulp_error(np.float32(fast_normal._KAT_VALUES), want[idx]).max() <= 4.0


@needs_op
def test_tail_refinement_end_cell(op):
    # ulp_check.cc found it: key [7, 8073], block 1660, radius word w2 in an end cell.
    key0, key1, block, pair = 7, 8073, 1660, 1
    w = [x[block] for x in stream_words(key0, key1, block + 1)]
    radius_word = int(w[2 * pair])
    assert radius_word in (0, MASK32)
    p = 2 * block + pair  # refinement block of this pair: top bit of counter word 1 set
    y = [
        int(x[0])
        for x in philox(
            [p & MASK32], [(p >> 32) | 0x80000000], [key1 & MASK32], [key1 >> 32], key0 & MASK32, key0 >> 32
        )
    ]
    i = next(i for i, v in enumerate(y) if v != 0 or i == 3)
    v = (y[i] + 0.5) * 2.0 ** (-64 - 32 * i)
    log_u = math.log1p(-v) if radius_word == MASK32 else math.log(v)
    r = math.sqrt(-2.0 * log_u)
    c, s = (x[0] for x in ref_cos_sin(np.array([w[2 * pair + 1]], np.uint64)))
    got = draw([64 * (block // 16 + 1)], [key0, key1])
    at = 64 * (block // 16) + 32 * pair + block % 16
    assert ulp_error(got[[at, at + 16]], np.array([r * c, r * s])).max() <= 4.0
    if radius_word == 0:  # u < 2^-32: a radius beyond the 32-bit grid's reach
        assert abs(got[at]) ** 2 + abs(got[at + 16]) ** 2 > -2 * math.log(2.0**-32)


@needs_op
def test_isa_paths_are_bit_identical(op):
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    base = draw([100_003], [11, 12], 1.7, isa="portable")
    compared = 0
    for isa, flag in (("auto", None), ("avx2", " avx2"), ("avx512", " avx512f")):
        if flag and flag not in flags:
            continue
        np.testing.assert_array_equal(draw([100_003], [11, 12], 1.7, isa=isa).view(np.uint32), base.view(np.uint32))
        compared += 1
    assert compared >= 1


# ----------------------------------------------------------------------------
# distribution
# ----------------------------------------------------------------------------
@needs_op
def test_moments(op):
    n = 4_000_000
    z = draw([n], [2024, 1]).astype(np.float64)
    mean, var = z.mean(), z.var()
    skew = np.mean((z - mean) ** 3) / var**1.5
    kurt = np.mean((z - mean) ** 4) / var**2 - 3.0
    assert abs(mean) < 5 * math.sqrt(1 / n)  # 0.0025
    assert abs(var - 1) < 5 * math.sqrt(2 / n)  # 0.0035
    assert abs(skew) < 5 * math.sqrt(6 / n)  # 0.0061
    assert abs(kurt) < 5 * math.sqrt(24 / n)  # 0.0122


def _normal_cdf(x):
    try:
        from scipy.special import ndtr

        return ndtr(x)
    except ImportError:
        return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def ks_test(z):
    """Kolmogorov-Smirnov statistic vs N(0, 1) and its asymptotic p-value (numpy only)."""
    z = np.sort(z.astype(np.float64))
    n = len(z)
    cdf = _normal_cdf(z)
    d = max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d  # Stephens' correction
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return d, min(max(p, 0.0), 1.0)


@needs_op
def test_kolmogorov_smirnov(op):
    z = draw([1_000_000], [99, 5])
    d, p = ks_test(z)
    assert p > 1e-3, (d, p)
    try:
        from scipy import stats
    except ImportError:
        return
    res = stats.kstest(z.astype(np.float64), "norm")
    assert abs(res.statistic - d) < 1e-9
    assert res.pvalue > 1e-3


@needs_op
def test_chi_square_on_equiprobable_bins(op):
    # 1,000 bins of equal N(0,1) mass: catches grid / discretisation artefacts KS can miss.
    n, bins = 2_000_000, 1000
    z = draw([n], [5, 55]).astype(np.float64)
    counts = np.bincount(np.minimum((_normal_cdf(z) * bins).astype(np.int64), bins - 1), minlength=bins)
    chi2 = np.sum((counts - n / bins) ** 2 / (n / bins))
    # chi2 with 999 dof: mean 999, sd 44.7; 5 sd.
    assert abs(chi2 - (bins - 1)) < 5 * math.sqrt(2 * (bins - 1)), chi2


@needs_op
def test_tail_frequencies(op):
    n = 1 << 24
    z = np.abs(draw([n], [31337, 0]))
    for k in (3.0, 4.0, 5.0):
        p = math.erfc(k / math.sqrt(2))  # P(|Z| > k)
        count = int(np.count_nonzero(z > k))
        sd = math.sqrt(n * p * (1 - p))
        assert abs(count - n * p) < 5 * sd + 1, (k, count, n * p)
    assert z.max() > 5.0


# ----------------------------------------------------------------------------
# independence
# ----------------------------------------------------------------------------
@needs_op
def test_neighbouring_keys_and_lags_are_uncorrelated(op):
    n = 1_000_000
    tol = 5 / math.sqrt(n)
    base = draw([n], [1000, 77]).astype(np.float64)
    for other in ([1001, 77], [1000, 78], [999, 77], [1000, 76]):
        z = draw([n], other).astype(np.float64)
        assert abs(np.corrcoef(base, z)[0, 1]) < tol, other
    # lag 16 = the other half of a Box-Muller pair, 32 = the block's other pair, 64 = next chunk.
    for lag in (1, 2, 15, 16, 17, 32, 48, 64, 1024):
        a, b = base[:-lag], base[lag:]
        assert abs(np.corrcoef(a, b)[0, 1]) < tol, lag
        assert abs(np.corrcoef(a * a, b * b)[0, 1]) < tol, ("squares", lag)


# ----------------------------------------------------------------------------
# API
# ----------------------------------------------------------------------------
@needs_op
def test_deterministic_prefix_consistent_and_key_sensitive(op):
    a = draw([1000], [3, 4])
    np.testing.assert_array_equal(a, draw([1000], [3, 4]))
    np.testing.assert_array_equal(a[:100], draw([100], [3, 4]))
    np.testing.assert_array_equal(a.reshape(10, 100), draw([10, 100], [3, 4]))
    assert not np.any(a == draw([1000], [3, 5]))
    assert not np.any(a == draw([1000], [4, 4]))
    u = fast_normal.fast_normal([1000], tf.constant([3, 4], tf.uint64)).numpy()
    np.testing.assert_array_equal(u, a)


@needs_op
def test_stddev_scaling(op):
    one = draw([4099], [8, 9])
    np.testing.assert_array_equal(draw([4099], [8, 9], 2.5), (one * np.float32(2.5)).astype(np.float32))
    np.testing.assert_array_equal(draw([4099], [8, 9], 0.0), np.zeros(4099, np.float32))


@needs_op
@pytest.mark.parametrize("shape", [[], [0], [0, 5], [1], [3], [63], [64], [65], [4097], [7, 13, 3], [2, 0, 3]])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_shapes(op, shape, dtype):
    z = fast_normal.fast_normal(tf.constant(shape, dtype), tf.constant([1, 1], tf.int64))
    assert z.dtype == tf.float32 and z.shape.as_list() == shape
    size = int(np.prod(shape))
    np.testing.assert_array_equal(z.numpy().reshape(-1), draw([size], [1, 1]))
    assert np.all(np.isfinite(z.numpy()))


@needs_op
def test_argument_errors(op):
    key = tf.constant([1, 2], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-negative"):
        fast_normal.fast_normal(tf.constant([3, -1]), key)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(tf.errors.InvalidArgumentError, match="stddev.*finite and >= 0"):
            fast_normal.fast_normal([3], key, bad)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="key"):
        fast_normal.fast_normal([3], tf.constant([1, 2, 3], tf.int64))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="1-D|rank"):
        fast_normal.fast_normal(tf.constant([[3]]), key)
    with pytest.raises(ValueError, match="isa"):
        fast_normal.fast_normal([3], key, isa="sse9")


@needs_op
def test_normal_draws_fresh_keys_from_the_generator(op):
    gen = tf.random.Generator.from_seed(5)
    a = fast_normal.normal(gen, [2, 3], 1.0).numpy()
    b = fast_normal.normal(gen, [2, 3], 1.0).numpy()
    assert a.shape == (2, 3) and not np.any(a == b)
    gen.reset_from_seed(5)
    np.testing.assert_array_equal(fast_normal.normal(gen, [2, 3], 1.0).numpy(), a)
    # mixed python / tensor dims, TensorShape, tensor stddev
    dim = tf.constant(4)
    assert fast_normal.normal(gen, [dim, 2], tf.constant(0.5)).shape == (4, 2)
    assert fast_normal.normal(gen, tf.TensorShape([3]), 2.0).shape == (3,)
    per_column = fast_normal.normal(gen, [1000, 2], tf.constant([0.0, 1.0])).numpy()
    assert np.all(per_column[:, 0] == 0) and per_column[:, 1].std() > 0.5


@needs_op
def test_in_tf_function_not_constant_folded(op):
    gen = tf.random.Generator.from_seed(1)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def noise_like(x):
        return x + fast_normal.normal(gen, tf.shape(x), 2.0)

    zeros = tf.zeros([300_000])
    first, second = noise_like(zeros).numpy(), noise_like(zeros).numpy()
    assert not np.any(first == second)  # a fresh key on every call: nothing folded
    assert abs(first.std() - 2.0) < 0.02
    graph = noise_like.get_concrete_function().graph
    assert "TfdpEmbedFastNormal" in {o.type for o in graph.get_operations()}

    @tf.function
    def constant_shape():
        return fast_normal.normal(gen, [5000], 1.0)

    assert not np.array_equal(constant_shape().numpy(), constant_shape().numpy())


@needs_op
def test_graph_mode_session(op):
    fast_normal.available()
    with tf.Graph().as_default():
        key = tf.compat.v1.placeholder(tf.int64, [2])
        z = fast_normal.fast_normal([1000], key, 1.0)
        assert z.shape.as_list() == [1000]
        with tf.compat.v1.Session() as sess:
            a = sess.run(z, {key: [3, 4]})
            b = sess.run(z, {key: [3, 5]})
    np.testing.assert_array_equal(a, draw([1000], [3, 4]))
    assert not np.any(a == b)


@needs_op
def test_mechanism_noise_uses_the_op(op):
    from tfdp_embed.mechanisms.eana import EANA

    mech = EANA(l2_norm_clip=1.0, noise_multiplier=1.0, seed=3)
    fn = tf.function(lambda: mech._noise_like([4096, 64], 1.0))
    assert "TfdpEmbedFastNormal" in {o.type for o in fn.get_concrete_function().graph.get_operations()}
    a, b = fn().numpy(), fn().numpy()
    assert a.shape == (4096, 64) and not np.any(a == b)
    assert abs(a.std() - 1.0) < 0.01


# ----------------------------------------------------------------------------
# build, lock, fallback (subprocesses)
# ----------------------------------------------------------------------------
def _run(script, env_extra, timeout=240):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO), **env_extra)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=REPO,
    )


def test_fallback_when_disabled_and_without_compiler(tmp_path):
    script = """
        import warnings
        import numpy as np
        from tfdp_embed.keras2._keras import tf
        from tfdp_embed.ops import fast_normal
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gen = tf.random.Generator.from_seed(7)
            a = fast_normal.normal(gen, [5, 3], 2.0).numpy()
            b = fast_normal.normal(gen, [4], 1.0).numpy()
            fn = tf.function(lambda: fast_normal.normal(gen, [6], 1.0))
            c, d = fn().numpy(), fn().numpy()
        gen.reset_from_seed(7)
        np.testing.assert_array_equal(a, gen.normal([5, 3], stddev=2.0).numpy())
        np.testing.assert_array_equal(b, gen.normal([4]).numpy())
        assert not np.array_equal(c, d)
        print("warnings:", sum("fast Gaussian sampler op is unavailable" in str(w.message) for w in caught))
        print("available:", fast_normal.available())
    """
    disabled = _run(script, {"TFDP_EMBED_FAST_NORMAL": "0", "TFDP_EMBED_CACHE": str(tmp_path / "a")})
    assert disabled.returncode == 0, disabled.stderr[-3000:]
    assert "warnings: 0" in disabled.stdout and "available: False" in disabled.stdout
    assert not (tmp_path / "a").exists()  # nothing was built
    no_cxx = _run(script, {"CXX": str(tmp_path / "no-such-compiler"), "TFDP_EMBED_CACHE": str(tmp_path / "b")})
    assert no_cxx.returncode == 0, no_cxx.stderr[-3000:]
    assert "warnings: 1" in no_cxx.stdout and "available: False" in no_cxx.stdout
    build = _run(
        "from tfdp_embed.ops import build; raise SystemExit(build.main([]))",
        {"CXX": str(tmp_path / "no-such-compiler"), "TFDP_EMBED_CACHE": str(tmp_path / "c")},
    )
    assert build.returncode == 0 and "WARNING" in build.stderr and "falls back" in build.stderr


@needs_op
def test_parallel_builds_compile_once(op, tmp_path):
    # A fake compiler that logs each compilation, waits, and copies the real library.
    real = fast_normal.build()
    log = tmp_path / "compilations.log"
    fake = tmp_path / "fake-g++"
    fake.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then echo "fake-g++ 1.0"; exit 0; fi
        echo compile >> {log}
        sleep 2
        while [ "$#" -gt 0 ]; do if [ "$1" = "-o" ]; then out="$2"; fi; shift; done
        cp {real} "$out"
    """)
    )
    fake.chmod(0o755)
    env = {"CXX": str(fake), "TFDP_EMBED_CACHE": str(tmp_path / "cache")}
    # Each process waits at a barrier so that all three call build() at once.
    script = textwrap.dedent(f"""
        import os, pathlib, time
        from tfdp_embed.ops import fast_normal
        barrier = pathlib.Path({str(tmp_path / "barrier")!r})
        barrier.mkdir(exist_ok=True)
        (barrier / str(os.getpid())).touch()
        deadline = time.time() + 120
        while len(list(barrier.iterdir())) < 3 and time.time() < deadline:
            time.sleep(0.05)
        print("LIB", fast_normal.build())
    """)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO), **env),
            cwd=REPO,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    libs = {line for o in outs for line in o[0].splitlines() if line.startswith("LIB")}
    assert len(libs) == 1
    assert log.read_text().count("compile") == 1


def test_benchmark_smoke(tmp_path):
    from benchmarks import normal_sampler

    results, out_json, png = tmp_path / "RESULTS.md", tmp_path / "ns.json", tmp_path / "ns.png"
    files = ["--json", str(out_json), "--png", str(png)]
    assert (
        normal_sampler.main(
            ["--sizes", "4096", "--repeats", "2", "--warmup", "1", "--results-md", str(results), *files]
        )
        == 0
    )
    assert results.read_text().startswith("# Benchmark results\n\nProtocol:")
    assert json.loads(out_json.read_text())["rows"][0]["n"] == 4096 and png.stat().st_size > 1000
    results.write_text("# Benchmark results\n")
    assert (
        normal_sampler.main(
            [
                "--sizes",
                "4096",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "--results-md",
                str(results),
                "--note",
                "a note",
                "--json",
                "",
                "--png",
                "",
            ]
        )
        == 0
    )
    text = results.read_text()
    assert text.startswith("# Benchmark results\n\n## New measurements (not yet folded in)\n")
    assert "\n### normal_sampler — " in text
    assert "| 4,096 | tf_generator_normal |" in text and "Load average" in text and "a note" in text
    if fast_normal.compiler() is not None:
        assert "| 4,096 | fast_normal[auto] |" in text
