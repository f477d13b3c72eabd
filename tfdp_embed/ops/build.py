"""Builds the custom ops ahead of time: `python -m tfdp_embed.ops.build`.

`make install` runs it. Without a C++ compiler it prints a warning and
exits 0: the library then falls back to `tf.random.Generator.normal`.

    python -m tfdp_embed.ops.build              # build (cached) + smoke test
    python -m tfdp_embed.ops.build --force      # rebuild
    python -m tfdp_embed.ops.build --ulp-check [--exhaustive]
        # also compile and run ulp_check.cc: max ulp error of log, sqrt,
        # sin, cos and of the outputs against double libm, ISA identity
    python -m tfdp_embed.ops.build --strict     # exit 1 on any failure
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from tfdp_embed.ops import fast_normal


def _warn(message: str) -> None:
    print(f"WARNING: tfdp_embed.ops.build: {message}", file=sys.stderr, flush=True)


def ulp_check(exhaustive: bool) -> int:
    """Compiles ulp_check.cc next to the op library and runs it; returns its exit status."""
    cxx = fast_normal.compiler()
    if cxx is None:
        _warn("no C++ compiler: cannot run the ulp check")
        return 1
    source = fast_normal.SOURCE.with_name("ulp_check.cc")
    binary = fast_normal.build_dir(cxx) / "ulp_check"
    binary.parent.mkdir(parents=True, exist_ok=True)
    command = [
        cxx,
        "-std=c++17",
        "-O3",
        "-ffp-contract=off",
        "-fno-fast-math",
        "-pthread",
        str(source),
        "-o",
        str(binary),
    ]
    print(" ".join(command), flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        _warn("compiling ulp_check.cc failed:\n" + result.stderr[-4000:])
        return 1
    return subprocess.run([str(binary)] + (["--exhaustive"] if exhaustive else [])).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="rebuild even if a cached library exists")
    parser.add_argument("--strict", action="store_true", help="exit 1 (not 0) when the op cannot be built")
    parser.add_argument("--ulp-check", action="store_true", help="also run the accuracy check (ulp_check.cc)")
    parser.add_argument("--exhaustive", action="store_true", help="with --ulp-check: all 2^32 words")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the compiler command")
    args = parser.parse_args(argv)

    if fast_normal.compiler() is None:
        _warn(
            "no C++ compiler found (g++ or $CXX): the fast Gaussian op is not built; "
            "tfdp_embed falls back to tf.random.Generator.normal (correct, much slower noise)."
        )
        return 1 if args.strict else 0
    start = time.perf_counter()
    try:
        library = fast_normal.build(force=args.force, verbose=args.verbose)
        import tensorflow as tf

        fast_normal._load()  # noqa: SLF001 (loads and runs the known-answer test)

        z = fast_normal.fast_normal([1 << 16], tf.constant([1, 2], tf.int64), 1.0).numpy()
    except Exception as err:  # noqa: BLE001 (report every failure the same way)
        _warn(
            f"the fast Gaussian op could not be built or loaded; tfdp_embed falls back to "
            f"tf.random.Generator.normal. Reason: {err}"
        )
        return 1 if args.strict else 0
    mean, var = float(z.mean()), float(z.var())
    print(
        f"fast_normal op: {library} ({time.perf_counter() - start:.1f} s); known-answer test ok; "
        f"65,536 draws: mean {mean:+.4f}, variance {var:.4f}"
    )
    if args.ulp_check:
        return ulp_check(args.exhaustive)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "ulp_check"]
