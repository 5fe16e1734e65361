"""Property-based API tests from the service's own OpenAPI (schemathesis): whatever a client sends
within or around the schema, the service never answers with a 5xx."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the dev extra")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from dinrec.feature_store.online.memory import MemoryStore  # noqa: E402
from dinrec.feature_store.settings import FeatureStoreSettings  # noqa: E402
from dinrec.serving.settings import ServingSettings  # noqa: E402
from dinrec.streams.inprocess import InProcessStream  # noqa: E402
from tests.serving.conftest import live_server  # noqa: E402


def test_no_input_makes_the_service_fail(tiny_run):
    """Every operation of the schema, 60 generated requests each (valid and schema-violating)."""
    from hypothesis import given

    store = MemoryStore()
    store.write(list(tiny_run[0].events()))
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="store"), FeatureStoreSettings(),
                     store=store, stream=InProcessStream()) as client:
        schema = schemathesis.openapi.from_url(f"{client.base_url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
            "GET /recommend", "POST /recommend", "POST /events", "GET /readyz", "GET /healthz"}
        for op in operations:
            @given(case=op.as_strategy())
            @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            def no_server_error(case) -> None:
                case.call_and_validate(checks=[not_a_server_error])

            no_server_error()
