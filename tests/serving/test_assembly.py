"""The service's assembly: one frozen value built after its parts, and routes that each take only the parts
they use (docs/architecture.md: the service)."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from fastapi.routing import APIRoute

from dinrec.serving import ab_routes, admin, admin_catalog, admin_experiments
from dinrec.serving import routes as routes_module
from dinrec.serving.app import create_app
from dinrec.serving.deps import ServiceState
from dinrec.serving.settings import ServingSettings


def _calls(dependant):
    yield dependant.call
    for sub in dependant.dependencies:
        yield from _calls(sub)


def test_no_route_receives_the_whole_state():
    create_app(ServingSettings())  # every router included
    routes = [r for module in (routes_module, admin, ab_routes, admin_experiments, admin_catalog)
              for r in module.router.routes if isinstance(r, APIRoute)]
    assert len(routes) >= 15  # /recommend, /events, the admin and A/B routes, ...
    for route in routes:
        for call in _calls(route.dependant):
            hints = typing.get_type_hints(call)
            assert ServiceState not in hints.values(), f"{route.path} {call.__name__} takes the whole state"


def test_the_state_is_frozen():
    assert ServiceState.__dataclass_params__.frozen  # type: ignore[attr-defined]  # set by @dataclass, not in stubs
    field = dataclasses.fields(ServiceState)[0]
    state = object.__new__(ServiceState)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(state, field.name, None)
