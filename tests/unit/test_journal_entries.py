"""An entry's JSON: the time as ISO 8601 UTC to the millisecond (formatted once per second, so it must agree with a
fresh format at every instant), no field named like a credential, nothing ``None``."""

from __future__ import annotations

import json
import time

import pytest

from infra.journal import encode_entry, iso_now


def _fresh(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"


@pytest.mark.parametrize(
    "epochs",
    [
        [0.0, 0.999, 1.0, 1.0005],
        [1_764_615_599.9996, 1_764_615_600.0, 1_764_615_600.123, 1_764_615_599.5],  # across a second, and back
        [1_798_761_599.999, 1_798_761_600.001],  # a new year
    ],
)
def test_iso_now_matches_a_fresh_format_at_every_instant(epochs: list[float]) -> None:
    for epoch in epochs:
        assert iso_now(epoch) == _fresh(epoch)


def test_iso_now_without_an_argument_is_now() -> None:
    before = time.time()
    stamp = iso_now()
    assert _fresh(before)[:19] <= stamp[:19] <= _fresh(time.time())[:19]


def test_an_entry_drops_credentials_and_nones_and_keeps_the_rest() -> None:
    entry = json.loads(
        encode_entry(
            "call",
            "booking-agent-1",
            {"payment_token": "tok_visa", "Authorization": "Bearer x", "cardNumber": "4242", "error": None, "n": 1},
            at=1_764_615_600.5,
        )
    )
    assert entry == {"kind": "call", "at": "2025-12-01T19:00:00.500Z", "instance": "booking-agent-1", "n": 1}
