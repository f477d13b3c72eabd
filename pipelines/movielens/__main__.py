"""`python -m pipelines.movielens`: the MovieLens pipeline's command line (`cli.main`)."""

import sys

from pipelines.movielens.cli import main

sys.exit(main())
