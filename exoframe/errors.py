"""User-facing errors: shown as one line (no traceback unless --debug).

Defined with the other input checks in exoframe/sim/inputs.py, at the bottom of the package,
so that the network model needs nothing above it."""
from .sim.inputs import MAX_SHOWN, ExoframeError, did_you_mean, shorten, unknown_name_error

__all__ = ["ExoframeError", "did_you_mean", "shorten", "unknown_name_error", "MAX_SHOWN"]
