"""Every service's app, each a thin shell around its graph or loop: ``booking`` (the user-facing booking API),
``search``, ``payment`` and ``recovery_worker``. Served by import string (``stack.services``), never imported by
another package.
"""

__all__: list[str] = []
