"""keylane: publish events to keylane's single-writer-per-key work queue on
Kafka, and handle them in exec handlers.

- :class:`keylane.Publisher` (``keylane.publisher``) publishes: the
  envelope, the idempotency id and keylane's partition, so a key always
  reaches the worker that owns it. It needs confluent-kafka.
- :mod:`keylane.handler` writes an exec handler as one function; it needs
  nothing beyond the standard library, so a handler runs without
  confluent-kafka installed.
- :mod:`keylane.envelope` encodes and decodes the envelope;
  :mod:`keylane.routing` computes partitions.
"""
from typing import Any

from keylane.errors import (
    ConfigError,
    DeliveryError,
    EventError,
    KeylaneError,
    PartitionsChanged,
    PublishError,
)
from keylane.routing import murmur2, partition

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Delivery",
    "DeliveryError",
    "DeliveryFuture",
    "Event",
    "EventError",
    "KeylaneError",
    "PartitionsChanged",
    "PublishError",
    "Publisher",
    "decode",
    "encode_event",
    "make_id",
    "murmur2",
    "partition",
]


# The envelope needs msgpack and the publisher confluent-kafka: each is
# imported when first asked for, so that a handler needs neither.
_LAZY = {
    "Publisher": "publisher",
    "Delivery": "publisher",
    "DeliveryFuture": "publisher",
    "Event": "envelope",
    "decode": "envelope",
    "encode_event": "envelope",
    "make_id": "envelope",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError("module 'keylane' has no attribute %r" % name)
    import importlib

    value = getattr(importlib.import_module("keylane." + module), name)
    globals()[name] = value
    return value
