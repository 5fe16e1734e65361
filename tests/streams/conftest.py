"""Fixtures shared by the streams tests: each stream backend."""

from __future__ import annotations

import pytest

from dinrec.streams.base import EventStream
from dinrec.streams.inprocess import InProcessStream
from dinrec.streams.kafka_stream import KafkaStream


@pytest.fixture(params=["inprocess", "kafka"])
def stream(request, unique):
    s: EventStream
    if request.param == "inprocess":
        s = InProcessStream()
    else:
        s = KafkaStream(request.getfixturevalue("kafka_bootstrap"), topic=unique)
    yield s
    s.close()
