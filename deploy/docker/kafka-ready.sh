#!/bin/bash
# The local Kafka image's health check: the broker accepts connections on its client port.
exec 3<>"/dev/tcp/127.0.0.1/${1:-9092}"
