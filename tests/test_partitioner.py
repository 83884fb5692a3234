"""The drop-in producer's murmur2, against the Java client's own test vectors (Kafka's
UtilsTest.testMurmur2), as signed 32-bit values."""

from __future__ import annotations

import pytest

from directlog.client.producer import murmur2


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_the_java_client(key: bytes, expected: int) -> None:
    found = murmur2(key)
    assert (found - (1 << 32) if found >= 1 << 31 else found) == expected
