"""Fast exact Gaussian noise: a counter-based, vectorised, multi-threaded TF op.

`normal(generator, shape, stddev)` is a drop-in for
`generator.normal(shape, stddev=stddev)` that is faster on CPU (timings:
benchmarks/RESULTS.md, section (f), "Gaussian sampler"). It
draws a fresh 128-bit key from the `tf.random.Generator` (so every call,
also inside a `tf.function`, gives new noise and nothing is constant-folded)
and runs the `TfdpEmbedFastNormal` op (fast_normal.cc): Philox4x32-10 +
Box-Muller with float32-accurate log/sin/cos (max error measured in
README.md), AVX-512 / AVX2 / portable paths chosen at run time, all
bit-identical, sharded over TensorFlow's intra-op threads.

The op is compiled from `fast_normal.cc` on first use (g++ or `$CXX`,
against the installed TensorFlow's headers) into a cache directory,

    $TFDP_EMBED_CACHE/<tf-version>-<hash>/        if TFDP_EMBED_CACHE is set,
    ~/.cache/tfdp_embed/<tf-version>-<hash>/      otherwise,

under a file lock (parallel pytest workers build it once), or ahead of time
with `python -m tfdp_embed.ops.build` (`make install` does). When it cannot
be built or loaded (no compiler, ...), `normal` falls back to
`generator.normal` with a one-time warning; `TFDP_EMBED_FAST_NORMAL=0`
forces the fallback without trying.

Placement: there is only a CPU kernel. Where a GPU or TPU is visible, `normal`
uses `generator.normal` (accelerator kernels; `placement`); the raw
`fast_normal` op still runs on the CPU (soft placement) for LazyDP's keyed
streams, whose values must not depend on the device.

Example:
    >>> gen = tf.random.Generator.from_seed(0)
    >>> z = normal(gen, [4096, 64], stddev=1.5)   # float32 [4096, 64]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import tensorflow as tf

from tfdp_embed.ops import placement

OP_NAME = "TfdpEmbedFastNormal"
SOURCE = Path(__file__).with_name("fast_normal.cc")
# Compiled together into one library: the sampler and the fused sparse-row ops
# (sparse_rows.cc, which includes the sampler; wrappers in sparse_rows.py).
SOURCES = (SOURCE, SOURCE.with_name("sparse_rows.cc"))
OP_NAMES = (
    OP_NAME,
    "TfdpEmbedScaledSegmentSum",
    "TfdpEmbedPooledWeightSquares",
    "TfdpEmbedNoisedValues",
    "TfdpEmbedLazyCatchUp",
    "TfdpEmbedLazyRecordStep",
    "TfdpEmbedLazyCatchUpNoise",
    "TfdpEmbedLazyAddRows",
    "TfdpEmbedRowsSum",
    "TfdpEmbedScatterAddSum",
    "TfdpEmbedMomentumSum",
    "TfdpEmbedLazyMomentumAdd",
)
LIBRARY_NAME = "_fast_normal_op.so"
ENV_SWITCH = "TFDP_EMBED_FAST_NORMAL"
ENV_CACHE = "TFDP_EMBED_CACHE"
ISAS = ("auto", "avx512", "avx2", "portable")

# -O3 without -march: the AVX2/AVX-512 paths carry their own target
# attributes and are chosen at run time. -ffp-contract=off: no FMA
# contraction, so that every path rounds identically.
CXXFLAGS = (
    "-std=c++17",
    "-O3",
    "-fPIC",
    "-shared",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-Wno-deprecated-declarations",
)


class BuildError(RuntimeError):
    """The op library could not be compiled or loaded (the message says why)."""


_lock = threading.Lock()
_module = None
_error: str | None = None
_warned = False


def enabled() -> bool:
    """False when TFDP_EMBED_FAST_NORMAL is 0/false/off/no (forces the fallback)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def compiler() -> str | None:
    """The C++ compiler to use: `$CXX`, else g++; None when not found."""
    cxx = os.environ.get("CXX") or "g++"
    return shutil.which(cxx)


def _compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.splitlines()[0] if out.stdout else "unknown"


def compile_command(cxx: str, sources, output: Path) -> list:
    """The full compiler command line for the op library (`sources`: one path or several)."""
    sources = [sources] if isinstance(sources, (str, Path)) else list(sources)
    return [
        cxx,
        *CXXFLAGS,
        *tf.sysconfig.get_compile_flags(),
        *(str(source) for source in sources),
        "-o",
        str(output),
        *tf.sysconfig.get_link_flags(),
    ]


def cache_root() -> Path:
    """`$TFDP_EMBED_CACHE`, else `$XDG_CACHE_HOME/tfdp_embed`, else `~/.cache/tfdp_embed`."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tfdp_embed"


def build_dir(cxx: str | None = None) -> Path:
    """`<cache_root>/<tf-version>-<hash of source, flags, compiler, python>`."""
    cxx = cxx or compiler() or "c++"
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    digest.update(repr((CXXFLAGS, tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags())).encode())
    digest.update(_compiler_version(cxx).encode())
    digest.update(f"{sys.platform}-{sys.version_info[:2]}".encode())
    return cache_root() / f"{tf.__version__}-{digest.hexdigest()[:16]}"


class _FileLock:
    """An exclusive `flock` on `path` (a no-op where fcntl does not exist)."""

    def __init__(self, path: Path):
        self.path = path
        self.handle = None

    def __enter__(self):
        self.handle = open(self.path, "a+")
        try:
            import fcntl

            fcntl.flock(self.handle, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover (Windows)
            pass
        return self

    def __exit__(self, *exc):
        try:
            import fcntl

            fcntl.flock(self.handle, fcntl.LOCK_UN)
        except ImportError:  # pragma: no cover
            pass
        self.handle.close()


def build(force: bool = False, verbose: bool = False) -> Path:
    """Compiles the op library into the cache (if not there yet); returns its path.

    Safe to call from several processes at once (file lock). Raises
    `BuildError` when there is no compiler or the compilation fails.
    """
    cxx = compiler()
    if cxx is None:
        raise BuildError(
            f"no C++ compiler found ({os.environ.get('CXX') or 'g++'} is not on PATH; set $CXX to use another)"
        )
    directory = build_dir(cxx)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BuildError(f"cannot create the cache directory {directory}: {err} (set ${ENV_CACHE})") from err
    library = directory / LIBRARY_NAME
    with _FileLock(directory / ".lock"):
        if library.exists() and not force:
            return library
        fd, tmp_name = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=directory)
        os.close(fd)
        tmp = Path(tmp_name)
        command = compile_command(cxx, SOURCES, tmp)
        if verbose:
            print(" ".join(command), flush=True)
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.SubprocessError) as err:
            tmp.unlink(missing_ok=True)
            raise BuildError(f"running the compiler failed: {err}") from err
        if result.returncode != 0:
            tmp.unlink(missing_ok=True)
            log = directory / "build-error.log"
            log.write_text(" ".join(command) + "\n\n" + result.stdout + result.stderr)
            tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
            names = " + ".join(source.name for source in SOURCES)
            raise BuildError(f"compiling {names} failed (full log: {log}):\n{tail}")
        os.replace(tmp, library)  # atomic: other processes never see a partial file
    return library


# Outputs 0, 1, 2, 3, 17, 63 for key [1, 2]: checked against an independent
# float64 reference (numpy Philox cross-checked with TF's, then Box-Muller)
# in tests/ops/test_fast_normal.py. A library that disagrees (a miscompiled
# kernel would silently break the privacy guarantee) is not used.
_KAT_INDICES = (0, 1, 2, 3, 17, 63)
_KAT_VALUES = (
    -0.4288627505302429,
    0.5014969706535339,
    -0.6345771551132202,
    -0.4304758310317993,
    -0.642013669013977,
    2.4611282348632812,
)


def _known_answer_test(module) -> None:
    with tf.init_scope():
        if not tf.executing_eagerly():  # TF1-style graph: cannot run it here
            return
        for isa in ("auto", "portable"):
            z = module.tfdp_embed_fast_normal(
                shape=tf.constant([64], tf.int64), key=tf.constant([1, 2], tf.int64), stddev=tf.constant(1.0), isa=isa
            ).numpy()
            got = [float(z[i]) for i in _KAT_INDICES]
            if any(abs(g - w) > 1e-6 * max(1.0, abs(w)) for g, w in zip(got, _KAT_VALUES)):
                raise BuildError(f"known-answer test failed (isa={isa}): got {got}, want {list(_KAT_VALUES)}")


def _load():
    """The loaded op module, building it if needed; raises BuildError."""
    global _module, _error
    with _lock:
        if _module is not None:
            return _module
        if _error is not None:
            raise BuildError(_error)
        try:
            library = build()
            try:
                module = tf.load_op_library(str(library))
            except Exception as err:
                raise BuildError(f"loading {library} failed: {err}") from err
            for name in OP_NAMES:
                tf.no_gradient(name)
            _known_answer_test(module)
        except BuildError as err:
            _error = str(err)
            raise
        _module = module
        return module


def available() -> bool:
    """True when the op is enabled and built/loaded (builds it on first call)."""
    if not enabled():
        return False
    try:
        _load()
    except BuildError:
        return False
    return True


def unavailable_reason() -> str | None:
    """Why the fallback is used (None when the op is available)."""
    if not enabled():
        return f"{ENV_SWITCH}={os.environ.get(ENV_SWITCH)!r} forces the fallback"
    try:
        _load()
    except BuildError as err:
        return str(err)
    return None


def _op_or_none():
    global _warned
    if not enabled():
        return None
    try:
        return _load()
    except BuildError as err:
        if not _warned:
            _warned = True
            warnings.warn(
                "tfdp_embed: the fast Gaussian sampler op is unavailable; using "
                f"tf.random.Generator.normal instead (much slower, equally exact). Reason: {err}",
                RuntimeWarning,
                stacklevel=3,
            )
        return None


def _shape_tensor(shape) -> tf.Tensor:
    if isinstance(shape, tf.TensorShape):
        shape = shape.as_list()
    if isinstance(shape, (list, tuple)):
        if not shape:
            return tf.constant([], tf.int64)
        if all(isinstance(d, int) or hasattr(d, "__index__") and not tf.is_tensor(d) for d in shape):
            return tf.constant([int(d) for d in shape], tf.int64)
        return tf.stack([tf.cast(d, tf.int64) for d in shape])
    shape = tf.convert_to_tensor(shape)
    if shape.dtype not in (tf.int32, tf.int64):
        shape = tf.cast(shape, tf.int64)
    return shape


@tf.autograph.experimental.do_not_convert
def fast_normal(shape, key, stddev=1.0, *, isa: str = "auto") -> tf.Tensor:
    """The raw op: N(0, stddev^2) float32 of `shape`, a pure function of (key, shape).

    Args:
      shape: 1-D int32/int64 shape (list or tensor), entries >= 0.
      key: int64 or uint64 `[2]`: key[0] is the Philox key, key[1] the high
        half of the counter. Element i depends only on (key, i): the same
        key gives the same numbers; a longer shape extends a shorter one.
        Reusing a key reuses noise: take keys from a generator (`normal`).
      stddev: float32 scalar, finite and >= 0.
      isa: "auto", or force "avx512", "avx2" or "portable" (tests,
        benchmarks; all give identical bits).

    Raises:
      BuildError: the op is unavailable (see `unavailable_reason`).
      tf.errors.InvalidArgumentError: negative shape, bad key, stddev < 0,
        NaN or inf, or an `isa` this CPU lacks.
    """
    if isa not in ISAS:
        raise ValueError(f"`isa` must be one of {ISAS}; received {isa!r}.")
    module = _load()
    return module.tfdp_embed_fast_normal(
        shape=_shape_tensor(shape), key=key, stddev=tf.cast(stddev, tf.float32), isa=isa
    )


@tf.autograph.experimental.do_not_convert
def normal(generator: tf.random.Generator, shape, stddev=1.0, dtype=tf.float32) -> tf.Tensor:
    """`generator.normal(shape, stddev=stddev, dtype=dtype)`, fast.

    Draws a fresh 128-bit key from `generator` (advancing it, like any
    draw) and runs the op. Falls back to `generator.normal` (one warning
    per process) when the op is unavailable, when TFDP_EMBED_FAST_NORMAL=0,
    and for dtypes other than float32. Works eagerly, in `tf.function`
    and in graph mode; not differentiable (like any noise).

    Args:
      generator: the `tf.random.Generator` that owns the noise stream.
      shape: output shape: list of ints and/or scalar tensors, TensorShape,
        or a 1-D int tensor.
      stddev: scalar standard deviation (>= 0); a non-scalar tensor is
        applied by broadcasting after the draw.

    Returns:
      `dtype` tensor of `shape`.
    """
    dtype = tf.as_dtype(dtype)
    op = _op_or_none() if dtype == tf.float32 and placement.fused_allowed_for() else None
    if op is None:
        return generator.normal(shape, stddev=stddev, dtype=dtype)
    key = generator.uniform_full_int([2], dtype=tf.int64)
    stddev = tf.cast(stddev, tf.float32)
    if stddev.shape.rank != 0:
        return op.tfdp_embed_fast_normal(shape=_shape_tensor(shape), key=key, stddev=tf.constant(1.0)) * stddev
    return op.tfdp_embed_fast_normal(shape=_shape_tensor(shape), key=key, stddev=stddev)


__all__ = [
    "CXXFLAGS",
    "ENV_CACHE",
    "ENV_SWITCH",
    "ISAS",
    "LIBRARY_NAME",
    "OP_NAME",
    "OP_NAMES",
    "SOURCE",
    "SOURCES",
    "BuildError",
    "available",
    "build",
    "build_dir",
    "cache_root",
    "compile_command",
    "compiler",
    "enabled",
    "fast_normal",
    "normal",
    "unavailable_reason",
]
