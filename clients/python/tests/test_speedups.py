"""keylane._speedups, the publish path in C, gives the bytes and the
partition the Python rules give, and hands back (None) whatever they would
refuse. KEYLANE_REQUIRE_SPEEDUPS=1 (make test) fails rather than skips
when it was not built."""
import os
import random

import pytest

from keylane import envelope as env
from keylane.routing import partition

try:
    from keylane._speedups import encode
except ImportError:
    if os.environ.get("KEYLANE_REQUIRE_SPEEDUPS"):
        raise
    pytest.skip("keylane._speedups was not built (no C compiler at install)", allow_module_level=True)


def test_same_bytes_and_partitions_as_python():
    rnd = random.Random(29)
    widths = [0, 1, 31, 32, 255, 256, 65535, 65536]
    for i in range(3000):
        key = bytes(rnd.randrange(256) for _ in range(rnd.choice([1, 2, 3, 4, 5, 9, 64, 1024])))
        typ = "t" * rnd.choice([1, 31, 32, 255]) if i % 7 else "é€"
        event_id = env.make_id() if i % 3 else "id-" + "x" * rnd.choice([0, 28, 29, 252]) + "😀"[: i % 2]
        if len(event_id.encode()) > 255:
            event_id = event_id[:200]
        ts = rnd.choice([0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)])
        payload = b"p" * rnd.choice(widths)
        n = rnd.choice([1, 2, 7, 16, 1000, 100000])
        got = encode(key, typ, event_id, ts, payload, n)
        _, want, _ = env.encode_event(key, typ, payload, event_id, ts=ts)
        assert got == (want, partition(key, n)), (key, typ, event_id, ts, len(payload), n)


@pytest.mark.parametrize(
    "args",
    [
        (b"", "t", "i", 1, b"", 4),
        (b"k" * 1025, "t", "i", 1, b"", 4),
        (b"k", "", "i", 1, b"", 4),
        (b"k", "t" * 256, "i", 1, b"", 4),
        (b"k", "é" * 128, "i", 1, b"", 4),
        (b"k", "t", "", 1, b"", 4),
        (b"k", "t", "i" * 256, 1, b"", 4),
        (b"k", "t", "~t/0/1/0", 1, b"", 4),
        (b"k", "~timer", "i", 1, b"", 4),
        (b"k", "t", "a\0b", 1, b"", 4),
        (b"k", "t", "\ud800", 1, b"", 4),
        (b"k", "\udfff", "i", 1, b"", 4),
        (b"k", "t", "i", 2**63, b"", 4),
        (b"k", "t", "i", 1.5, b"", 4),
        (b"k", "t", "i", 1, b"p" * (env.PAYLOAD_MAX + 1), 4),
        (b"k", "t", "i", 1, bytearray(b"p"), 4),
        (b"k", "t", "i", 1, b"", 0),
        (bytearray(b"k"), "t", "i", 1, b"", 4),
        (b"k", b"t", "i", 1, b"", 4),
    ],
)
def test_what_python_refuses_is_handed_back(args):
    assert encode(*args) is None


def test_every_field_at_its_limit_still_fits_a_record():
    # only headers (which the C path leaves to Python) can exceed it
    value, _ = encode(b"k" * 1024, "t" * 255, "i" * 255, -(2**63), b"p" * env.PAYLOAD_MAX, 4)
    assert 1024 + len(value) <= env.RECORD_MAX


def test_ids_made_in_c_are_uuidv7_and_grow():
    import uuid

    from keylane._speedups import make_id

    ids = [make_id(1_700_000_000_000 + i // 5000) for i in range(20000)]
    assert ids == sorted(ids) and len(set(ids)) == 20000
    u = uuid.UUID(ids[0])
    assert u.version == 7 and u.variant == uuid.RFC_4122 and str(u) == ids[0]
    import time

    now = env._ids.make()  # the publisher's ids are these
    assert now > ids[-1] and abs(int(now.replace("-", "")[:12], 16) - time.time() * 1000) < 5000
