"""tfdp_embed: differentially private training of large embedding models."""

from tfdp_embed import _keras  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF is used)
