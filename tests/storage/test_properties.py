"""Property tests over random batch sequences: what goes in comes back, across restarts
(clean and unclean), and random damage to the tail is cut away, never served."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from directlog.records.batch import Record, build_batch, iter_batches, verify_crc
from directlog.records.compression import Compression
from directlog.records.errors import RecordError
from services.broker.storage import (
    LogConfig,
    MessageTooLargeError,
    PartitionLog,
    RecordBatchTooLargeError,
)
from tests.storage.helpers import T0, ManualClock, read_all, tree_digest

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=256)

batch_specs = st.lists(
    st.tuples(
        st.lists(st.one_of(st.none(), st.binary(max_size=300)), min_size=1, max_size=5),
        st.sampled_from(list(Compression)),
    ),
    min_size=1,
    max_size=25,
)


def append_all(log: PartitionLog, specs) -> list[Record]:
    """Append each spec as one batch; return the records with the offsets they should get."""
    expected = []
    for values, codec in specs:
        first = log.log_end_offset
        records = [Record(i, T0 + first + i, None, v) for i, v in enumerate(values)]
        log.append(build_batch(records, compression=codec))
        expected += [Record(first + r.offset, r.timestamp, None, r.value) for r in records]
    return expected


def open_in(directory: Path, **kwargs) -> PartitionLog:
    return PartitionLog.open(directory / "t-0", CONFIG, clock=ManualClock(), **kwargs)


@given(batch_specs, st.booleans())
def test_append_read_restart_round_trip(specs, clean):
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        log = open_in(directory)
        expected = append_all(log, specs)
        assert read_all(log) == expected
        if clean:
            log.close()
        reopened = open_in(directory, clean_shutdown=clean, recovery_point=log.log_end_offset)
        assert reopened.log_end_offset == len(expected)
        assert read_all(reopened) == expected
        reopened.close()


@given(batch_specs, st.data())
def test_reads_are_whole_batches_within_their_bounds(specs, data):
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        log = open_in(directory)
        append_all(log, specs)
        offset = data.draw(st.integers(0, log.log_end_offset))
        max_bytes = data.draw(st.integers(1, 5000))
        upper = data.draw(st.integers(offset, log.log_end_offset))
        chunk = log.read(offset, max_bytes, upper_offset=upper).records.read()
        headers = [h for _, h in iter_batches(chunk)]
        assert sum(h.size for h in headers) == len(chunk)  # whole batches only
        everything = b"".join(s.log.read(0, s.size) for s in log.segments)
        holding = [h for _, h in iter_batches(everything) if h.last_offset >= offset]
        if holding and holding[0].last_offset < upper:  # the batch holding offset is below upper
            assert headers and headers[0] == holding[0]
            assert len(chunk) <= max_bytes or len(headers) == 1
        else:  # batches are never split: one straddling `upper` is withheld whole
            assert headers == []
        assert all(h.last_offset < upper for h in headers)


@given(batch_specs, st.data())
def test_random_tail_damage_is_cut_and_never_served(specs, data):
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        log = open_in(directory)
        expected = append_all(log, specs)
        head = log.segments[-1]
        raw = bytearray(head.log.path.read_bytes())
        starts = [p for p, _ in iter_batches(bytes(raw))]
        # Damage a byte the CRC or the framing covers: not base offset or leader epoch,
        # which lie outside the CRC by the format's design (the broker stamps them).
        position = data.draw(st.integers(0, len(raw) - 1))
        batch_start = max(p for p in starts if p <= position)
        relative = position - batch_start
        truncate = data.draw(st.booleans())
        if truncate:
            raw = raw[:position]
        elif relative < 8 or 12 <= relative < 16:
            raw = raw[:position]  # an offset/epoch byte: truncate there instead
        else:
            raw[position] ^= data.draw(st.integers(1, 255))
        head.log.path.write_bytes(bytes(raw))
        recovered = open_in(directory)
        survivors = read_all(recovered)
        assert survivors == expected[: len(survivors)]  # a prefix, unchanged
        kept_batches = sum(1 for p in starts if p < batch_start)
        assert recovered.log_end_offset >= head.base_offset
        assert len(recovered.segments[-1].log.read(0, 1 << 20)) == (
            starts[kept_batches] if kept_batches < len(starts) else len(raw)
        )
        for segment in recovered.segments:
            chunk = segment.log.read(0, segment.size)
            for p, header in iter_batches(chunk):
                verify_crc(chunk, p, header)


@given(st.binary(max_size=400))
def test_arbitrary_bytes_are_refused_cleanly(garbage):
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        log = open_in(directory)
        log.append(build_batch([Record(0, T0, None, b"kept")]))
        before = tree_digest(directory)
        try:
            log.append(garbage)
        except (RecordError, MessageTooLargeError, RecordBatchTooLargeError) as error:
            assert str(error)
            assert tree_digest(directory) == before
            assert [r.value for r in read_all(log)] == [b"kept"]
        else:
            raise AssertionError(f"accepted garbage {garbage!r}")
