"""`python -m builder.runtime.smoke`: the smoke program (see program.py)."""

import sys

from builder.runtime.smoke.program import main

sys.exit(main())
