"""`python -m reference_router` runs the router CLI."""

import sys

from .cli import main

sys.exit(main())
