"""Poisson batches of data too large for one machine, built by an Apache Beam pipeline.

The same map / group / truncate as `tfdp_embed.data.one_pass_poisson_batches`
(each example draws the steps it joins, examples are grouped by step, an
oversized step is cut to a uniform random subset), run by any Beam runner and
written as TFRecord shards that the trainer streams in step order with
`tfdp_embed.data.beam_poisson_batches`.

This package imports neither TensorFlow nor `tfdp_embed` (whose import loads
TensorFlow): the Beam job runs in an environment of its own (the `beam`
extra; `make test` uses `.venv-beam`), the trainer in the library's.

    python -m tfdp_embed_beam --input 'day_*.tsv' --output /data/poisson --sampling_probability 0.001 --epochs 3

Modules: `record_format` (the files both sides read), `sampling` (the per-example
draw, numpy only), `pipeline` (the Beam job; imports `apache_beam`).

References: Chua et al., "Scalable DP-SGD: Shuffling vs. Poisson
Subsampling", NeurIPS 2024 (massively parallel Poisson batch construction).
"""
