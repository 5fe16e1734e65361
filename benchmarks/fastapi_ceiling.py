"""The framework's own ceiling on this box, for `dinrec bench serve --vs fastapi`.

A bare FastAPI app whose ``GET /recommend?user_id=…&k=…`` answers a body of the shape dinrec answers
(serving.schemas.RecommendResponse: a request id, the user, k items with ids, categories and scores),
validated and serialised by the same response model, with nothing behind it: no store, no recall, no
model, no middleware. Served by stock uvicorn (httptools, uvloop where installed) with dinrec's worker
count, driven by the same load generator on the same cores, it is the most throughput a FastAPI service
of this shape can have here — dinrec's held rate is reported as a fraction of it.

Run as ``uvicorn benchmarks.fastapi_ceiling:create_app --factory``.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import FastAPI, Query

from dinrec.serving.schemas import RecommendedItem, RecommendResponse


def create_app() -> FastAPI:
    app = FastAPI(title="fastapi-ceiling", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/recommend", response_model=RecommendResponse)
    async def recommend(user_id: Annotated[str, Query(min_length=1, max_length=128)],
                        k: Annotated[int, Query(ge=1, le=500)] = 10) -> RecommendResponse:
        items = [RecommendedItem(item_id=f"i{j}", category_id=f"c{j % 7}", score=1.0 - j / 1000) for j in range(k)]
        return RecommendResponse(request_id=uuid.uuid4().hex, user_id=user_id, items=items)

    @app.get("/readyz")
    async def readyz() -> dict:
        return {"ready": True}

    return app
