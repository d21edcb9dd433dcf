"""`python -m builder.cli`: the same command line as the `builder` script."""

import sys

from builder.cli.main import main

sys.exit(main())
