"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from dinrec.events.schema import BehaviourEvent, ExternalId

# The event schema's id: a user id the API takes must be one its impressions can carry.
UserId = ExternalId


class ContextItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    item_id: ExternalId
    category_id: ExternalId = "0"


class RecommendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"user_id": "u42", "k": 10},
        {"user_id": "u42", "k": 5, "shown": ["i7"],
         "context": [{"item_id": "i9", "category_id": "c2"}]},
    ]})

    user_id: UserId
    k: int | None = Field(None, ge=1, description="how many items; default DINREC_DEFAULT_K, at most DINREC_MAX_K")
    explain: bool = Field(False, description=(
        "name, per item, the behaviours that drew it (DIN's attention); the user's own behaviours, so it needs the "
        "admin token unless DINREC_EXPLAIN=public"))
    shown: list[ExternalId] = Field(default_factory=list, max_length=500,
                                    description="items recently shown to the user: pushed down")
    context: list[ContextItem] = Field(
        default_factory=list, max_length=200,
        description="the client's own view of the user's recent items, oldest first: used as the history when the "
                    "feature store cannot be read")


class Because(BaseModel):
    item_id: str
    category_id: str
    weight: float = Field(description="the behaviour's weight in DIN's activation unit for this item")


class RecommendedItem(BaseModel):
    item_id: str
    category_id: str
    score: float
    because: list[Because] | None = Field(None, description="with explain: the behaviours with the largest weights")


_OPERATOR = "only in answers to the operator (`Authorization: Bearer <DINREC_ADMIN_TOKEN>`)"


class Degraded(StrEnum):
    """Why a list was answered without one of its dependencies (``degraded_reasons``)."""

    feature_store = "feature_store"  # the store was down or slow: the request's context stood in for the history
    deadline = "deadline"  # the request was past its deadline before ranking: popular items
    ranking = "ranking"  # recall or scoring failed: popular items


class RecommendResponse(BaseModel):
    """What a client sees: the list. Which arm of an experiment, which model and strategy served it, and how
    much of the user's history the store holds are the operator's: a client that saw its arm could click in
    one arm only and steer the experiment's guardrail (and the model it promotes)."""

    request_id: str
    user_id: str
    items: list[RecommendedItem]
    degraded: bool = Field(False, description="answered without a dependency (see degraded_reasons)")
    degraded_reasons: list[Degraded] = Field(default_factory=list, description="why, in the order they happened")
    model_version: str | None = Field(None, description=f"the model that ranked the list; {_OPERATOR}")
    strategy: str | None = Field(None, description=f"din or popular; {_OPERATOR}")
    history_len: int | None = Field(None, description=f"behaviours of the user's history read; {_OPERATOR}")
    experiment: str | None = Field(None, description=f"the A/B experiment this user is in (null: none); {_OPERATOR}")
    variant: str | None = Field(None, description=f"the user's variant in it; {_OPERATOR}")


OPERATOR_FIELDS = ("model_version", "strategy", "history_len", "experiment", "variant")


class EventsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"events": [
        {"event_id": "e-1", "user_id": "u42", "item_id": "i9", "category_id": "c2", "event_type": "click",
         "ts": 1700000000.0}]}]})

    events: list[BehaviourEvent] = Field(min_length=1, max_length=1000)


class EventsResponse(BaseModel):
    accepted: int
    sink: str
