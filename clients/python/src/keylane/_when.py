"""A delayed event's time: the rule the envelope (envelope.py) and the
exec handler's emits (handler.py) share. Standard library only, so that
keylane.handler needs no msgpack."""
from __future__ import annotations

import datetime as _dt
import time
from typing import Optional, Union

from keylane.errors import EventError

_INT64_MAX = (1 << 63) - 1


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


def now_ms() -> int:
    return time.time_ns() // 1000000
