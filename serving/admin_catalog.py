"""The catalog's trusted feed: ``POST /admin/catalog`` (admin token) admits items at once.

Items clients name join the catalog only once popular enough (``DINREC_CATALOG_MIN_USERS``,
feature_store.online.base): invented ids never reach serving. A shop's own catalog is trusted: its new
items are recallable from the next catalog poll (``DINREC_CATALOG_POLL_S``), before anyone took them.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request
from pydantic import BaseModel, ConfigDict, Field

from dinrec.events.schema import ExternalId
from dinrec.serving.admin import _authorize, audit
from dinrec.serving.deps import Settings, Store

router = APIRouter(prefix="/admin", tags=["admin"])


class CatalogItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item_id: ExternalId
    category_id: ExternalId


class CatalogFeed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[CatalogItem] = Field(min_length=1, max_length=10_000)


class Admitted(BaseModel):
    admitted: int = Field(description="items new to the catalog (the others were in it: their category stays)")
    received: int


@router.post("/catalog", response_model=Admitted)
def admit(settings: Settings, store: Store, request: Request, feed: CatalogFeed,
          authorization: Annotated[str | None, Header()] = None) -> Admitted:
    _authorize(settings, authorization)
    admitted = store.admit([(i.item_id, i.category_id) for i in feed.items])
    audit(request, "catalog", received=len(feed.items), admitted=admitted)
    return Admitted(admitted=admitted, received=len(feed.items))
