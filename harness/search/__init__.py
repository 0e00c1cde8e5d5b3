"""Fault search (`pdchaos search`); the defaults the CLI, the driver and each seed share are here, where the
CLI can read them without importing Hypothesis."""

# Seconds a failing case's fault schedule is also run shifted by: a failure counts only if it shows at each
# (`seedrun`). Fractions of a scaled probe interval, the phase real time does not keep.
DEFAULT_SHIFTS_S: tuple[float, ...] = (0.1, 0.2)
# Cases per seed before the next seed starts.
DEFAULT_EXAMPLES = 25
