"""`python -m fake_engines` runs the engine CLI."""

import sys

from .cli import main

sys.exit(main())
