"""LazyDP: deferred noise on the rows a step does not read (`mechanism.LazyDP`).

Modules: `mechanism` (the class), `rows` (each table's catch-ups at run time, on the path `init` chose),
`hooks` (read hooks, read guards, lookahead rows), `traced` (the flush and the shared traced catch-up),
`history` (per-row step stamps and step sums), `closed_form` (the sums and moments of the deferred noise),
`catch_up` (the TensorFlow-ops catch-up), `fused` (the custom-op catch-up, and the choice of path),
`sgd` (the optimizer protocol).
"""

from tfdp_embed.mechanisms.lazy.mechanism import LazyDP

__all__ = ["LazyDP"]
