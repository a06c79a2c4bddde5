"""``loop-actors trace export`` sends a stored history's spans over OTLP/HTTP, with the live ids."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from loop_actors import Runtime
from tests.support.cli import run_in_process
from tests.support.telemetry import in_memory_telemetry
from tests.telemetry.test_child_spans import travel


class Receiver:
    """A local OTLP/HTTP receiver: keeps each request's path and body; answers ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[tuple[str, str, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((self.path, self.headers["Content-Type"], body))
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def spans(self) -> set[tuple[str, bytes, bytes, bytes]]:
        """(name, trace id, span id, parent id) of every span received."""
        found = set()
        for _, _, body in self.requests:
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        found.add((span.name, span.trace_id, span.span_id, span.parent_span_id))
        return found


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    thread = threading.Thread(target=running.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.server.shutdown()
        running.server.server_close()


async def run_tree(db: str) -> set[tuple[str, bytes, bytes, bytes]]:
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime(db) as runtime:
            await runtime.run(travel, "a trip to Lisbon", invocation_id="trip-1")
        return {
            (
                s.name,
                s.context.trace_id.to_bytes(16),
                s.context.span_id.to_bytes(8),
                s.parent.span_id.to_bytes(8) if s.parent else b"",
            )
            for s in captured.spans()
        }


def test_an_export_delivers_the_tree_with_the_ids_it_had_live(
    tmp_path: Path,
    receiver: Receiver,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    live = trio.run(run_tree, db)
    done = run_in_process(
        "trace", "export", "trip-1", "--otlp", receiver.url,
        cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db=db,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert receiver.spans() == live
    [(path, content_type, _)] = receiver.requests
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    assert (
        done.stdout
        == f"exported {len(live)} spans of 3 invocation(s) to {receiver.url}/v1/traces\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("trip-1", "--otlp", "ftp://collector:4318"), "needs an http:// or https:// URL"),
        (("trip-1", "--otlp", "collector:4318"), "needs an http:// or https:// URL"),
        (("no-such-run", "--otlp", "http://127.0.0.1:9"), "no-such-run"),
    ],
)
def test_a_bad_url_or_id_is_a_usage_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    message: str,
) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    trio.run(run_tree, db)
    done = run_in_process(
        "trace", "export", *args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db=db
    )
    assert done.returncode == 2
    assert message in done.stderr


def test_an_endpoint_that_refuses_the_spans_is_reported_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refusing = Receiver(status=400)
    thread = threading.Thread(target=refusing.server.serve_forever, daemon=True)
    thread.start()
    try:
        db = f"sqlite:///{tmp_path / 'runs.db'}"
        trio.run(run_tree, db)
        done = run_in_process(
            "trace", "export", "trip-1", "--otlp", refusing.url + "/custom/path",
            cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db=db,
        )  # fmt: skip
    finally:
        refusing.server.shutdown()
        refusing.server.server_close()
    assert done.returncode == 2
    assert "did not take the spans" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert [path for path, _, _ in refusing.requests] == ["/custom/path"]


def _from_otlp_json(text: str) -> set[tuple[str, bytes, bytes, bytes]]:
    """The spans of an OTLP/JSON document, read back through protobuf (ids hex -> bytes)."""
    import base64
    import json

    from google.protobuf.json_format import ParseDict  # type: ignore[import-untyped]

    def as_protobuf_json(value: object) -> object:
        if isinstance(value, dict):
            return {
                key: base64.b64encode(bytes.fromhex(item)).decode()
                if key in ("traceId", "spanId", "parentSpanId")
                else as_protobuf_json(item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [as_protobuf_json(item) for item in value]
        return value

    request = ParseDict(as_protobuf_json(json.loads(text)), ExportTraceServiceRequest())
    return {
        (span.name, span.trace_id, span.span_id, span.parent_span_id)
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    }


def test_an_export_to_a_file_is_otlp_json_with_the_ids_it_had_live(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--out FILE`` writes one OTLP/JSON line (hex ids); ``--out -`` prints the same."""
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    live = trio.run(run_tree, db)
    out = tmp_path / "trip.otlp.json"
    written = run_in_process(
        "trace", "export", "trip-1", "--out", str(out),
        cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db=db,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    assert written.stdout == f"wrote {len(live)} spans of 3 invocation(s) to {out} as OTLP/JSON\n"
    text = out.read_text()
    assert text.endswith("\n")
    assert text.count("\n") == 1
    assert _from_otlp_json(text) == live
    some_trace_id = next(iter(live))[1].hex()
    assert f'"traceId":"{some_trace_id}"' in text  # hex, as OTLP/JSON says, not base64
    printed = run_in_process(
        "trace", "export", "trip-1", "--out", "-",
        cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db=db,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("trip-1", "--out", "missing-folder/trip.json"), "cannot write missing-folder/trip.json"),
        (("trip-1", "--out", "x.json", "--otlp", "http://127.0.0.1:9"), "not allowed with"),
        (("trip-1",), "one of the arguments --otlp --out is required"),
    ],
)
def test_a_file_that_cannot_be_written_or_two_targets_are_usage_errors(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    message: str,
) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    trio.run(run_tree, db)
    done = run_in_process(
        "trace", "export", *args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch, db=db
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "x.json").exists()
