"""pdchaos's vLLM shim: a fake engine where a harness starts vLLM. Only on the path when asked for
(`export PYTHONPATH="$(pdchaos engines shim):$PYTHONPATH"`); installing pdchaos never shadows a real vLLM."""

import sys
from pathlib import Path

# The shim runs under whatever `python3` a harness calls: make pdchaos importable from its own tree.
_ROOT = str(Path(__file__).resolve().parents[3])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

__version__ = "0.32.0+pdchaos.fake"
