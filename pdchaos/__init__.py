"""pdchaos: chaos test harness for prefill/decode disaggregated LLM serving."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pdchaos")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
