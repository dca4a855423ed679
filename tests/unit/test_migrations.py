"""``graph.migrations`` on checkpoints as LangGraph writes them: what a rename touches, and what it must leave."""

from __future__ import annotations

from typing import Any

from graph.migrations import Migration, migrate_checkpoint

V1, V2, V3 = "1.0.1", "2.0.2", "3.0.3"


def checkpoint() -> Any:
    """``reserve`` ran, ``charge`` is next; ``release_hold`` and ``refund`` join into ``finish``."""
    return {
        "v": 4,
        "id": "cp-1",
        "ts": "2031-01-01T00:00:00+00:00",
        "channel_values": {"reservation_id": "res-1", "branch:to:charge": None, "join:release_hold+refund:finish": []},
        "channel_versions": {
            "__start__": V1,
            "reservation_id": V2,
            "branch:to:reserve": V2,
            "branch:to:charge": V3,
            "join:release_hold+refund:finish": V1,
        },
        "versions_seen": {"__input__": {}, "reserve": {"branch:to:reserve": V2}},
        "updated_channels": ["branch:to:charge", "reservation_id"],
    }


def test_node_and_key_renames_reach_every_channel_that_names_them() -> None:
    migration = Migration(
        "old", nodes={"charge": "capture", "refund": "repay", "reserve": "hold"}, keys={"reservation_id": "hold_id"}
    )

    migrated, changed = migrate_checkpoint(checkpoint(), migration)

    assert migrated["channel_values"] == {
        "hold_id": "res-1",
        "branch:to:capture": None,
        "join:release_hold+repay:finish": [],
    }
    assert migrated["versions_seen"] == {"__input__": {}, "hold": {"branch:to:hold": V2}}
    assert migrated["updated_channels"] == ["branch:to:capture", "hold_id"]
    assert migrated["id"] == "cp-1", "the same checkpoint, written again"
    assert set(changed) == {"hold_id", "branch:to:capture", "branch:to:hold", "join:release_hold+repay:finish"}
    assert checkpoint()["channel_values"]["reservation_id"] == "res-1", "the original is not touched"


def test_a_new_key_gets_its_default_and_a_key_the_run_has_keeps_its_value() -> None:
    migration = Migration("old", defaults={"currency": "EUR", "reservation_id": "never"})

    migrated, changed = migrate_checkpoint(checkpoint(), migration)

    assert migrated["channel_values"]["currency"] == "EUR"
    assert migrated["channel_values"]["reservation_id"] == "res-1"
    assert changed == {"currency": V3}, "stored at the checkpoint's latest version, nothing else rewritten"


def test_an_empty_migration_changes_nothing() -> None:
    migrated, changed = migrate_checkpoint(checkpoint(), Migration("old"))
    assert migrated == checkpoint() and changed == {}
