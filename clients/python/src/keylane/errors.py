"""The exceptions of the keylane package.

Every message names the thing, the value and the fix, in the words
keylane's C library uses for the same problem, so that one search finds
both.
"""
from __future__ import annotations

from typing import List, Optional


class KeylaneError(Exception):
    """The base of every error this package raises."""


class EventError(KeylaneError, ValueError):
    """An event breaks a rule of the envelope (keylane's event.h): a key,
    id, type, payload or header that is empty, too long, not text, or a
    record over the size one Kafka record may carry. Nothing was sent."""


class ConfigError(KeylaneError, ValueError):
    """A setting keylane cannot run with (e.g. another partitioner)."""


class PartitionsChanged(KeylaneError):
    """The topic's partition count is not the one its keys were routed by:
    keys would move between owners, so nothing is published to it."""


class PublishError(KeylaneError):
    """Kafka did not take an event: the queue stayed full, the producer
    failed, or the topic's partition count could not be read."""


class DeliveryError(PublishError):
    """Events Kafka did not acknowledge, raised by Publisher.flush() for
    those that had no on_delivery callback of their own to tell."""

    def __init__(self, message: str, failed: Optional[List["object"]] = None):
        super().__init__(message)
        #: the Delivery of each event that failed
        self.failed = list(failed or [])
