"""A delayed event's time: the rule the envelope (envelope.py) and the
exec handler's emits (handler.py) share. Standard library only, so that
keylane.handler needs no msgpack."""
from __future__ import annotations

import datetime as _dt
import time
from typing import Optional, Union

from keylane.errors import EventError

_INT64_MAX = (1 << 63) - 1

#: 10^11 ms after the Unix epoch, 1973-03-03: a not_before below it is a
#: time in seconds (10^11 s is the year 5138), never one meant in ms.
NOT_BEFORE_MIN_MS = 100000000000

#: timer.max.delay's default, 7 days in ms: how far ahead of now, and how
#: far behind it, a not_before may be (Publisher's timer_max_delay_ms).
TIMER_MAX_DELAY_MS = 7 * 86400000

# Largest first: a duration is written in the first unit that divides it,
# as keylane's C library writes one (common/units.c).
_DURATIONS = (("d", 86400000), ("h", 3600000), ("m", 60000), ("s", 1000), ("ms", 1))


def not_before_ms(
    not_before: Union[int, _dt.datetime, None] = None,
    delay: Union[int, float, _dt.timedelta, None] = None,
    now: Optional[int] = None,
) -> int:
    """The envelope's not_before in ms since the Unix epoch (0: none), from
    ``not_before`` (int ms since the epoch, or an aware datetime) or
    ``delay`` (seconds as int or float, or a timedelta, from ``now``, ms,
    default the clock), not both. A delay of 0 is none, so that the
    envelope stays version 1. Raises EventError naming the problem."""
    if not_before is not None and delay is not None:
        raise EventError("both not_before and delay are given: pass one (not_before in ms since the Unix epoch or "
                         "as an aware datetime, or delay as seconds or a timedelta from now)")
    if not_before is not None:
        if isinstance(not_before, _dt.datetime):
            if not_before.tzinfo is None or not_before.utcoffset() is None:
                raise EventError(
                    "not_before %s is a naive datetime: give an aware one, such as "
                    "datetime.now(timezone.utc) + timedelta(minutes=15)" % not_before.isoformat()
                )
            delta = not_before - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
            ms = delta // _dt.timedelta(milliseconds=1)
            if ms <= 0:
                raise EventError("not_before %s is not after the Unix epoch" % not_before.isoformat())
            return ms
        if type(not_before) is not int or not 0 < not_before <= _INT64_MAX:
            raise EventError(
                "not_before is %r: give a positive int, ms since the Unix epoch (such as 1767225600000), or an "
                "aware datetime; omit it to have the event applied when it is read" % (not_before,)
            )
        return not_before
    if delay is None:
        return 0
    if isinstance(delay, _dt.timedelta):
        ms = delay // _dt.timedelta(milliseconds=1)
    elif type(delay) in (int, float) and delay == delay:
        ms = int(delay * 1000) if delay < 1e16 else _INT64_MAX
    else:
        raise EventError("delay is %r: give seconds (an int or float) or a timedelta, such as 900 or "
                         "timedelta(minutes=15)" % (delay,))
    if ms < 0:
        raise EventError("delay is %r, before now: give a delay of 0 or more, or not_before" % (delay,))
    if ms == 0:
        return 0
    base = now_ms() if now is None else now
    if ms > _INT64_MAX - base:
        raise EventError("delay %r ends after the year 292 million: give a shorter one" % (delay,))
    return base + ms


def _duration(ms: int) -> str:
    for name, mul in _DURATIONS:
        if ms > 0 and ms % mul == 0:
            return "%d%s" % (ms // mul, name)
    return "%d%s" % (ms, "ms" if ms else "")


def check_not_before(not_before: int, now: int, max_ms: int = TIMER_MAX_DELAY_MS) -> None:
    """The rule kl_publish() keeps on a delayed event's time, word for word
    (event/envelope.h, kl__not_before_publish_check()): ``not_before``
    (ms since the Unix epoch; 0 is none) is refused when it is below
    NOT_BEFORE_MIN_MS (a time in seconds), more than ``max_ms``
    (timer.max.delay) before ``now`` or more than ``max_ms`` after it;
    both bounds inclusive, ``max_ms`` 0 bounds neither side. Raises
    EventError naming the bound, by how much, and the fix."""
    nb = not_before
    if 0 < nb < NOT_BEFORE_MIN_MS // 1000:
        raise EventError(
            "not_before %d is a time before 1973 in milliseconds since the Unix epoch, and in seconds too; "
            "give milliseconds since the Unix epoch, or a delay" % nb
        )
    if 0 < nb < NOT_BEFORE_MIN_MS:
        raise EventError(
            "not_before %d is a time before 1973 in milliseconds since the Unix epoch: it looks like seconds; "
            "give milliseconds since the Unix epoch (%d if it is seconds), or a delay" % (nb, nb * 1000)
        )
    if nb <= 0 or max_ms <= 0:
        return
    if nb < now - max_ms:
        raise EventError(
            "not_before %d is %d ms in the past, %s more than timer.max.delay (%s) allows: give milliseconds "
            "since the Unix epoch of a time at most timer.max.delay ago (a past time runs at once), or omit "
            "not_before to have the event applied when it is read"
            % (nb, now - nb, _duration(now - nb - max_ms), _duration(max_ms))
        )
    if nb - now > max_ms:
        raise EventError(
            "not_before %d is %d ms from now, %s more than timer.max.delay (%s) allows: publish the event "
            "closer to its time, or raise timer.max.delay (at most store.dedup.retention)"
            % (nb, nb - now, _duration(nb - now - max_ms), _duration(max_ms))
        )


def now_ms() -> int:
    return time.time_ns() // 1000000
