"""The streaming reader: real traces read completely, bad files give one-line errors, chunking never matters."""

from __future__ import annotations

import gzip
import json
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decodetop.errors import UserInputError
from decodetop.traces import reader
from decodetop.traces.reader import GPU_KERNEL, GPU_MEMCPY, HOST_MODULE, read_trace
from tests.helpers.synth import SynthSpec, write_synthetic_trace

from .conftest import FIXTURES, fixture, write_trace


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.trace.json.gz")), ids=lambda p: p.name)
def test_recorded_traces_read_every_event(path: Path) -> None:
    """Every event of each recorded fixture is seen: the reader's count matches json.load's."""
    expected = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    trace = read_trace(path)
    assert trace.events_total == len(expected)
    kernels = [e for e in expected if e.get("cat") == "kernel"]
    assert sum(1 for k in trace.gpu_kind if k == GPU_KERNEL) == len(kernels)
    if kernels:
        first = min(kernels, key=lambda e: e["ts"])
        i = min(range(trace.n_gpu), key=trace.gpu_ts_us.__getitem__)
        assert trace.names[trace.gpu_name[i]] == first["name"]
        assert trace.gpu_corr[i] == first["args"]["correlation"]
    assert trace.meta["schemaVersion"] == 1


def test_keeps_memcpy_modules_and_gpu_annotations() -> None:
    trace = read_trace(fixture("h200_graph"))
    assert GPU_MEMCPY in trace.gpu_kind
    assert any(trace.names[n].startswith("ProfilerStep#") for n in trace.ga_name)
    eager = read_trace(fixture("h200_eager"))
    modules = {eager.names[n] for n, k in zip(eager.host_name, eager.host_kind, strict=True) if k == HOST_MODULE}
    assert "nn.Module: LlamaAttention_0" in modules
    # plain python_function frames are dropped: only module frames are kept
    assert all(m.startswith("nn.Module:") for m in modules)


def test_plain_json_and_bare_array_format(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "nvjet_x",
            "pid": 0,
            "tid": 7,
            "ts": 10,
            "dur": 5,
            "args": {"correlation": 3},
        },
        {"ph": "X", "cat": "Kernel", "name": "nvjet_y", "pid": 0, "tid": 7, "ts": "20.5", "dur": 5},
    ]
    plain = read_trace(write_trace(tmp_path / "t.json", events))
    assert plain.n_gpu == 2 and plain.gpu_ts_us[1] == 20.5
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(events))
    assert read_trace(bare).n_gpu == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (b"hello world", "not a JSON trace"),
        (b'{"a": 1}', "without a 'traceEvents' array"),
        (b'{"traceEvents": {"a": 1}}', "'traceEvents' is not an array"),
        (b'{"traceEvents": [1, 2]}', "event #0 is not a JSON object"),
        (b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1}, {"ph": "X", "name"', "truncated"),
        (b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1}', "truncated"),
        (b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1}, ]}', "malformed JSON"),
        (b'{"traceEvents": [{"ph": "X" "name": "k"}]}', "malformed JSON"),
        (b'{"traceEvents": [{"ph": "X"}] "x": 1}', "expected ',' or '}'"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"\x1f\x8b\x08\x00garbage-that-is-not-deflate", "gzip"),
    ],
)
def test_bad_files_give_one_line_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(UserInputError) as err:
        read_trace(path)
    text = str(err.value)
    assert message in text
    assert "\n" not in text
    assert str(path) in text


def test_truncated_gzip_and_missing_file(tmp_path: Path) -> None:
    data = fixture("cpu_eager").read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserInputError, match="truncated"):
        read_trace(cut)
    with pytest.raises(UserInputError, match="cannot open trace"):
        read_trace(tmp_path / "nope.json")


@settings(max_examples=25, deadline=None, derandomize=True)
@given(chunk=st.integers(min_value=1, max_value=300))
def test_chunk_size_never_changes_the_result(chunk: int) -> None:
    """Events and numbers cut at any chunk edge decode the same (raw_decode over the sliding buffer)."""
    events = [
        {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 1000.125 + i * 17.5, "dur": 12345.5}
        for i in range(20)
    ]
    text = json.dumps({"traceEvents": events, "traceName": "x" * 50})
    saved = reader.CHUNK_BYTES
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chunks.json"
        path.write_text(text)
        try:
            reader.CHUNK_BYTES = chunk
            trace = read_trace(path)
        finally:
            reader.CHUNK_BYTES = saved
    assert list(trace.gpu_ts_us) == [e["ts"] for e in events]
    assert list(trace.gpu_dur_us) == [12345.5] * 20
    assert [trace.names[n] for n in trace.gpu_name] == [e["name"] for e in events]


def test_large_trace_reads_in_bounded_memory(tmp_path: Path) -> None:
    """A 12 MB synthetic trace is read with a traced peak far below its size (the full benchmark reads 300 MB)."""
    path = tmp_path / "big.json"
    steps, events = write_synthetic_trace(path, 12_000_000, SynthSpec())
    size = path.stat().st_size
    tracemalloc.start()
    try:
        trace = read_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert trace.events_total == events
    assert sum(1 for n in trace.host_name if trace.names[n].startswith("ProfilerStep#")) == steps
    assert peak < 0.3 * size, f"peak {peak} bytes for a {size}-byte trace"
