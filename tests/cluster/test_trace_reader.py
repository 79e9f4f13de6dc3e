"""The trace reader (cluster/traces/reader.py): every format, every refusal named by file, line
and field, and the counting of bad lines."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.traces import TraceLineError, TraceReader, sniff_format
from cluster.traces.lines import MAX_LENGTH

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "data" / "traces" / "mooncake_conversation_10min.jsonl"
AZURE = ROOT / "data" / "traces" / "azure_code_2023_10min.csv"


def _mooncake(t: float, n: int, out: int, ids: list[int]) -> str:
    return json.dumps({"timestamp": t, "input_length": n, "output_length": out, "hash_ids": ids})


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _dynamo(received: float | None, n: int, out: int, hashes: list[int], *, block: int = 64,
            event: str = "request_end", wrap: bool = False, when: float | None = 5.0) -> str:
    row = {
        "schema": "dynamo.request.trace.v1",
        "event_type": event,
        "event_time_unix_ms": when,
        "agent_context": {"session_id": "s"},  # optional fields pass through
        "request": {
            "request_id": "r",
            "request_received_ms": received,
            "output_tokens": out,
            "ttft_ms": 12.5,
            "replay": {"trace_block_size": block, "input_length": n,
                       "input_sequence_hashes": hashes},
        },
    }
    return json.dumps({"event": row} if wrap else row)


def test_the_shipped_slices_read_whole() -> None:
    mooncake = TraceReader(MOONCAKE)
    rows = list(mooncake)
    assert mooncake.format == "mooncake" and mooncake.block_tokens == 512
    assert len(rows) == mooncake.stats.requests == 1750 and mooncake.stats.bad_lines == 0
    assert rows[0].timestamp_s == 0.0 and rows[-1].timestamp_s < 600.0
    assert all(len(r.block_ids or ()) == -(-r.input_length // 512) for r in rows)
    azure = TraceReader(AZURE)
    rows = list(azure)
    assert azure.format == "azure" and azure.block_tokens is None
    assert len(rows) == 1482 and all(r.block_ids is None for r in rows)
    assert rows[-1].timestamp_s - rows[0].timestamp_s < 600.0
    assert (rows[0].line, rows[0].input_length, rows[0].output_length) == (2, 4808, 10)


def test_the_format_is_sniffed(tmp_path: Path) -> None:
    assert sniff_format(MOONCAKE) == "mooncake" and sniff_format(AZURE) == "azure"
    dynamo = _write(tmp_path / "d.jsonl", [_dynamo(1000.0, 64, 4, [7])])
    assert sniff_format(dynamo) == "dynamo"
    wrapped = _write(tmp_path / "w.jsonl", [_dynamo(1000.0, 64, 4, [7], wrap=True)])
    assert sniff_format(wrapped) == "dynamo"
    headed = _write(tmp_path / "azure.txt", ["TIMESTAMP,ContextTokens,GeneratedTokens"])
    assert sniff_format(headed) == "azure"
    for bad in (["not json at all"], ['{"prompt": "hi"}'], ["[1, 2]"]):
        with pytest.raises(ValueError, match="--format"):
            sniff_format(_write(tmp_path / "x.jsonl", bad))


def test_gzip_is_read_by_its_bytes_not_its_name(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"  # no .gz: the magic bytes say gzip
    with gzip.open(path, "wt") as fh:
        fh.write(_mooncake(0, 600, 3, [1, 2]) + "\n" + _mooncake(10, 10, 1, [1]) + "\n")
    rows = list(TraceReader(path))
    assert [(r.timestamp_s, r.block_ids) for r in rows] == [(0.0, (1, 2)), (0.01, (1,))]


@pytest.mark.parametrize(
    ("line", "field", "message"),
    [
        (_mooncake(0, -5, 3, []), "input_length", "greater than or equal to 1"),
        (_mooncake(0, 600, 0, [1, 2]), "output_length", "greater than or equal to 1"),
        (_mooncake(0, 600, 3, [1]), "hash_ids", "1 ids, but 600 tokens make 2 blocks of 512"),
        (_mooncake(-1, 600, 3, [1, 2]), "timestamp", "greater than or equal to 0"),
        (json.dumps({"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [1],
                     "delay": 3}), "delay", "Extra inputs"),
        (json.dumps({"timestamp": 0, "input_length": "6", "output_length": 1, "hash_ids": [1]}),
         "input_length", "valid integer"),
        (json.dumps({"timestamp": 0, "input_length": 6, "output_length": 1,
                     "hash_ids": [-1]}), "hash_ids.0", "greater than or equal to 0"),
        ('{"timestamp": 0, "input_length": 6,', "(line)", "Invalid JSON"),
        (_mooncake(0, MAX_LENGTH + 1, 1, [1]), "input_length", "less than or equal"),
    ],
)
def test_a_bad_mooncake_line_is_named_by_file_line_and_field(
    tmp_path: Path, line: str, field: str, message: str
) -> None:
    path = _write(tmp_path / "t.jsonl", [_mooncake(0, 10, 1, [5]), line])
    with pytest.raises(TraceLineError, match=message) as caught:
        list(TraceReader(path, "mooncake"))
    assert (caught.value.path, caught.value.line, caught.value.field) == (path, 2, field)
    assert str(caught.value).startswith(f"{path}:2: {field}: ")


def test_a_prompt_beyond_the_context_is_refused_with_its_line(tmp_path: Path) -> None:
    fits, beyond = _mooncake(0, 1000, 24, [1, 2]), _mooncake(1, 1001, 24, [1, 3])
    path = _write(tmp_path / "t.jsonl", [fits, beyond])
    assert len(list(TraceReader(path))) == 2  # no context given: nothing to refuse
    skipped = TraceReader(path, max_context_tokens=1024, skip_bad_lines=True)
    assert [r.input_length for r in skipped] == [1000] and skipped.stats.bad_lines == 1
    with pytest.raises(TraceLineError, match=r":2: input_length: prompt \(1001 tokens\) \+ "
                       r"output \(24\) exceeds the model's context of 1024 tokens"):
        list(TraceReader(path, max_context_tokens=1024))


def test_bad_lines_can_be_counted_instead(tmp_path: Path) -> None:
    good = [_mooncake(t, 10, 1, [t]) for t in range(5)]
    lines = [good[0], "{oops", good[1], _mooncake(0, 10, 0, [1]), good[2], "", good[3], good[4]]
    reader = TraceReader(_write(tmp_path / "t.jsonl", lines), skip_bad_lines=True)
    rows = list(reader)
    assert [r.block_ids for r in rows] == [(t,) for t in range(5)]
    stats = reader.stats.as_dict()
    assert (stats["requests"], stats["bad_lines"], stats["lines"]) == (5, 2, 8)
    assert ":2: (line): " in stats["bad_examples"][0]
    assert ":4: output_length: " in stats["bad_examples"][1]


def test_azure_rows_are_checked_cell_by_cell(tmp_path: Path) -> None:
    header = "TIMESTAMP,ContextTokens,GeneratedTokens"
    ok = "2023-11-16 18:17:03.9799600,4808,10"
    later = "2023-11-16 18:17:04.5,100,5"
    rows = list(TraceReader(_write(tmp_path / "a.csv", [header, ok, later])))
    assert rows[1].timestamp_s - rows[0].timestamp_s == pytest.approx(0.52004)
    for bad, field in (
        ("2023-11-16 18:17:03.9799600,abc,10", "ContextTokens"),
        ("2023-11-16 18:17:03.9799600,48.5,10", "ContextTokens"),
        ("2023-13-16 18:17:03,48,10", "TIMESTAMP"),
        ("yesterday,48,10", "TIMESTAMP"),
        ("2023-11-16 18:17:03,48,0", "GeneratedTokens"),
        ("2023-11-16 18:17:03,48", "(line)"),
    ):
        path = _write(tmp_path / "a.csv", [header, ok, bad])
        with pytest.raises(TraceLineError) as caught:
            list(TraceReader(path))
        assert (caught.value.line, caught.value.field) == (3, field), bad
    with pytest.raises(ValueError, match="starts with the header TIMESTAMP,ContextTokens"):
        list(TraceReader(_write(tmp_path / "b.csv", ["time,prompt,output", ok])))


def test_dynamo_request_traces(tmp_path: Path) -> None:
    lines = [
        _dynamo(1000.0, 100, 4, [11, 12]),
        json.dumps({"schema": "dynamo.request.trace.v1", "event_type": "tool_end",
                    "event_time_unix_ms": 1500.0}),
        _dynamo(None, 64, 2, [11], when=2000.0, wrap=True),  # receive time from the event
    ]
    reader = TraceReader(_write(tmp_path / "d.jsonl", lines))
    rows = list(reader)
    assert reader.format == "dynamo" and reader.block_tokens == 64
    assert [(r.timestamp_s, r.input_length, r.output_length, r.block_ids) for r in rows] == [
        (1.0, 100, 4, (11, 12)), (2.0, 64, 2, (11,)),
    ]
    assert reader.stats.not_requests == 1
    mixed = [_dynamo(1000.0, 64, 1, [1]), _dynamo(1001.0, 64, 1, [1], block=16)]
    with pytest.raises(TraceLineError, match=r"request\.replay\.trace_block_size: 16, but earlier"):
        list(TraceReader(_write(tmp_path / "m.jsonl", mixed)))
    nowhen = [_dynamo(None, 64, 1, [1], when=None)]
    with pytest.raises(TraceLineError, match=r"request\.request_received_ms: missing"):
        list(TraceReader(_write(tmp_path / "n.jsonl", nowhen)))
    wrong = [_dynamo(1000.0, 64, 1, [1, 2, 3])]
    with pytest.raises(TraceLineError, match="input_sequence_hashes: 3 ids, but 64 tokens"):
        list(TraceReader(_write(tmp_path / "w.jsonl", wrong)))


def test_the_reader_refuses_what_is_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such trace file"):
        TraceReader(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="block_tokens"):
        TraceReader(MOONCAKE, block_tokens=0)
    with pytest.raises(ValueError, match="unknown trace format"):
        TraceReader(MOONCAKE, "parquet")  # type: ignore[arg-type]


rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 10**9),
        st.integers(1, 5000),
        st.integers(1, 4096),
    ),
    min_size=1,
    max_size=30,
)


@given(rows=rows_strategy, block=st.sampled_from([16, 64, 512]))
def test_valid_mooncake_rows_come_back_as_written(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[int, int, int]], block: int
) -> None:
    lines = []
    for k, (t, n, out) in enumerate(rows):
        ids = [k * 1000 + j for j in range(-(-n // block))]
        lines.append(_mooncake(t, n, out, ids))
    path = _write(tmp_path_factory.mktemp("h") / "t.jsonl", lines)
    got = list(TraceReader(path, block_tokens=block))
    assert [(r.timestamp_s, r.input_length, r.output_length) for r in got] == [
        (t / 1000.0, n, out) for t, n, out in rows
    ]
    assert [r.line for r in got] == list(range(1, len(rows) + 1))
