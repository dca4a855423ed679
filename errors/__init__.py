"""What an exception says, asked without importing what raised it: its chain walked once (``errors.causes``), and
whether a request ever left the process (``errors.connection_errors``). Below infra, so the adapters use it too.

The table (which exception gets which code and status) stays in ``infra.error_table``: its rows name the
adapters' own exceptions (A2A, the provider clients, the model) and the service shell answers with it, so it
can sit neither below infra nor above it.
"""

from errors.causes import causes
from errors.connection_errors import never_connected

__all__ = ["causes", "never_connected"]
