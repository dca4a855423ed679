"""The web console (service ``console``, port 8090): one page that shows the stack live and drives it.

``concierge serve console`` runs ``app``; ``concierge up`` starts it with the others. See ``docs/console.md``.
"""

from stack.webconsole.app import app, create_app

__all__ = ["app", "create_app"]
