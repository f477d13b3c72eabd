"""`python -m pipelines.criteo`: the Criteo pipeline's command line (`cli.main`)."""

import sys

from pipelines.criteo.cli import main

sys.exit(main())
