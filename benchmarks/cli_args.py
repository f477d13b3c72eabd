"""Comma-separated argument types shared by the benchmark CLIs."""

from __future__ import annotations


def floats(text: str) -> tuple:
    """ "0.01,0.001" -> (0.01, 0.001); empty items are dropped."""
    return tuple(float(x) for x in text.split(",") if x.strip())


def ints(text: str) -> tuple:
    """ "1e5,1000000" -> (100000, 1000000); scientific notation is accepted."""
    return tuple(int(float(x)) for x in text.split(",") if x.strip())
