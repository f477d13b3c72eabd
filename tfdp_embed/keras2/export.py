"""Releasing a tf-keras `DPModel`: `tfdp_embed.release` (the same for both front ends)."""

from tfdp_embed.release import REPORT_FILENAME, _without_read_hooks, export_saved_model, release_ready

__all__ = ["REPORT_FILENAME", "_without_read_hooks", "export_saved_model", "release_ready"]
