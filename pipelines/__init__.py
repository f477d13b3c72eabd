"""Command-line jobs built on tfdp_embed (`python -m pipelines.criteo ...`)."""
