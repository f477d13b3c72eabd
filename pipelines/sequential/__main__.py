"""`python -m pipelines.sequential`: the sequential pipeline's command line (`cli.main`)."""

import sys

from pipelines.sequential.cli import main

sys.exit(main())
