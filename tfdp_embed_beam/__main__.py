"""`python -m tfdp_embed_beam ...`: runs the Beam pipeline (see `tfdp_embed_beam.pipeline.main`)."""

from tfdp_embed_beam.pipeline import main

if __name__ == "__main__":
    main()
