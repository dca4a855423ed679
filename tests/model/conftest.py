"""The real-model tests (``make test-model``) are collected only with ``CONCIERGE_TEST_MODEL=1``: they fetch half a
gigabyte and keep both cores busy for minutes, so ``make test`` and ``make test-slow`` never see them."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("CONCIERGE_TEST_MODEL") == "1" else ["test_*.py"]
