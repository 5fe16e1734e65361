import json
from pathlib import Path

import pytest

from dinrec.events.errors import InvalidEvent
from dinrec.events.features import HistoryItem, behaviour_mask, is_behaviour, merge_history
from dinrec.events.schema import BehaviourEvent, dumps_many, loads_many

GOLDEN = Path(__file__).parents[1] / "golden" / "event_v1.json"


def test_wire_format_matches_golden_file():
    event = BehaviourEvent(event_id="e-1", user_id="u1", item_id="i9", category_id="c2",
                           event_type="click", ts=1700000000.0)
    assert json.loads(event.to_bytes()) == json.loads(GOLDEN.read_text())
    assert BehaviourEvent.from_bytes(GOLDEN.read_bytes()) == event


@pytest.mark.parametrize("raw, needle", [
    (b"not json", "invalid event"),
    (b'{"user_id": "u", "item_id": "i"}', "ts"),
    (b'{"user_id": "u", "item_id": "i", "ts": -5}', "ts"),
    (b'{"user_id": "", "item_id": "i", "ts": 5}', "user_id"),
    (b'{"user_id": "u", "item_id": "i", "ts": 5, "event_type": "like"}', "event_type"),
    (b'{"user_id": "u", "item_id": "i", "ts": 5, "surprise": 1}', "surprise"),
    (b'{"user_id": "u", "item_id": "i", "ts": 5, "v": 2}', "v"),
    (b'{"user_id": "u\\u001fx", "item_id": "i", "ts": 5}', "user_id: .*control characters"),
    (b'{"user_id": "u", "item_id": "i", "event_id": "a\\u0000", "ts": 5}', "event_id: .*control characters"),
    (b'{"user_id": "u", "item_id": "i", "ts": NaN}', "ts"),
    (b'{"user_id": "u", "item_id": "i", "ts": 1e999}', "ts"),
    (b'{"user_id": "u", "item_id": "\xff\xfe", "ts": 5}', "invalid unicode"),
    (b'{"user_id": "u", "item_id": "i", "ts": 5, "variant": "' + b"x" * 20000 + b'"}', "oversized"),
])
def test_bad_events_are_rejected_with_the_field_named(raw, needle):
    with pytest.raises(InvalidEvent, match=needle):
        BehaviourEvent.from_bytes(raw)


def test_jsonl_round_trip_and_line_numbers_in_errors():
    events = [BehaviourEvent(user_id="u", item_id=f"i{i}", ts=float(i)) for i in range(3)]
    assert loads_many(dumps_many(events)) == events
    with pytest.raises(InvalidEvent, match="line 2"):
        loads_many(dumps_many(events[:1]) + '{"bad": 1}\n')


def test_behaviour_rule_is_the_same_row_wise_and_vectorised():
    import numpy as np

    cases = [("click", None), ("impression", None), ("rate", 4.0), ("rate", 3.5), ("rate", None), ("buy", 1.0)]
    expected = [is_behaviour(t, v) for t, v in cases]
    assert expected == [True, False, True, False, False, True]
    types = np.array([t for t, _ in cases])
    values = np.array([np.nan if v is None else v for _, v in cases])
    assert behaviour_mask(types, values).tolist() == expected


def test_merge_history_newest_time_wins_and_dedupes():
    h = lambda ts, eid: HistoryItem(ts, eid, f"item{eid}", "c")  # noqa: E731
    merged = merge_history([h(1, "a"), h(3, "c")], [h(2, "b"), h(3, "c"), h(0, "z")], cap=3)
    assert [x.event_id for x in merged] == ["a", "b", "c"]
