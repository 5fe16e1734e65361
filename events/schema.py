"""The one behaviour-event schema, shared by loaders, the stream, the stores and training.

Ids are the *external* string ids of the source system; the model's integer vocabulary lives in
the trained bundle, so a new item can be ingested before any model knows it (it maps to index 0,
"unknown", until the next retraining).

Wire format: one JSON object per event, UTF-8 (see tests/golden/event_v1.json)::

    {"v": 1, "event_id": "e-1", "user_id": "u1", "item_id": "i9", "category_id": "c2",
     "event_type": "click", "ts": 1700000000.0, "value": null,
     "experiment": null, "variant": null}
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from dinrec.events.errors import InvalidEvent

SCHEMA_VERSION: Final = 1
# A valid event is well under 1 KiB (five ids of at most 128 characters); anything far larger is
# refused before it is parsed, so one huge record cannot stall ingestion.
MAX_EVENT_BYTES = 16 * 1024

# Impressions are logged for A/B CTR, never part of a behaviour history; everything else may be.
EventType = Literal["impression", "view", "click", "cart", "fav", "buy", "rate"]

# Stores join ids with a control character (the Redis member is "event␟item␟category"); refusing
# control characters here means no id can ever split or corrupt a stored record. A pattern (checked
# in pydantic's Rust core, not a Python callback: this runs for every ingested event).
_NO_CONTROL_CHARACTERS = r"^[^\x00-\x1f\x7f]*$"
ExternalId = Annotated[str, StringConstraints(min_length=1, max_length=128, strip_whitespace=True,
                                              pattern=_NO_CONTROL_CHARACTERS)]


def error_message(err: Mapping[str, Any]) -> str:
    """One validation error as a person should read it (used by the API's 422s too)."""
    if err.get("type") == "string_pattern_mismatch" and (err.get("ctx") or {}).get("pattern") == _NO_CONTROL_CHARACTERS:
        return "must not contain control characters (U+0000-U+001F, U+007F)"
    return str(err.get("msg", "")).removeprefix("Value error, ")


# 2001-09-09 .. 2286-11-20 in seconds would exclude old datasets; MovieLens/Amazon start in 1996.
MIN_TS = 0.0
MAX_TS = 4_102_444_800.0  # 2100-01-01


_AB_FIELDS = ("request_id", "position", "model_version")


class BehaviourEvent(BaseModel):
    """One thing a user did with an item, at a time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = SCHEMA_VERSION
    event_id: ExternalId = Field(default_factory=lambda: uuid.uuid4().hex)
    user_id: ExternalId
    item_id: ExternalId
    category_id: ExternalId = "0"
    event_type: EventType = "click"
    # allow_inf_nan=False: NaN and ±Infinity (which JSON parsers accept) are refused in pydantic's core.
    ts: float = Field(ge=MIN_TS, le=MAX_TS, allow_inf_nan=False, description="unix seconds")
    value: float | None = Field(default=None, allow_inf_nan=False, description="e.g. a rating for event_type='rate'")
    experiment: ExternalId | None = None
    variant: ExternalId | None = None
    # A/B logging (optional; on the wire only when set, so other events keep the v1 bytes):
    request_id: ExternalId | None = Field(default=None, description="the /recommend answer it is an impression of")
    position: int | None = Field(default=None, ge=0, le=10_000, description="an impression's rank in that answer")
    model_version: ExternalId | None = None

    def to_bytes(self) -> bytes:
        unset = {k for k in _AB_FIELDS if getattr(self, k) is None}
        return self.model_dump_json(exclude=unset).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | str) -> BehaviourEvent:
        if len(raw) > MAX_EVENT_BYTES:
            raise InvalidEvent(f"invalid event: oversized ({len(raw)} bytes > {MAX_EVENT_BYTES})")
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            raise InvalidEvent("invalid event: " + describe(exc)) from exc

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BehaviourEvent:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InvalidEvent("invalid event: " + describe(exc)) from exc


def describe(exc: ValidationError) -> str:
    """Every error of an event's validation as ``field: message``, joined by "; "."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "event"
        parts.append(f"{loc}: {error_message(err)}")
    return "; ".join(parts)


def dumps_many(events: list[BehaviourEvent]) -> str:
    """Newline-delimited JSON, the file format of `dinrec data synth` and event logs."""
    return "".join(e.to_bytes().decode() + "\n" for e in events)


def loads_many(text: str) -> list[BehaviourEvent]:
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(BehaviourEvent.from_bytes(line))
        except InvalidEvent as exc:
            raise InvalidEvent(f"line {lineno}: {exc}") from exc
        except json.JSONDecodeError as exc:  # pragma: no cover - pydantic wraps these
            raise InvalidEvent(f"line {lineno}: not JSON") from exc
    return out
