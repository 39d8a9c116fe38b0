"""`python -m longturn.cli ...`: the console script without its installed entry point."""

import sys

from longturn.cli import main

sys.exit(main())
