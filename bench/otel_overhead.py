"""What tracing costs a turn: the turn_overhead workload with OpenTelemetry off, then on.

Off is the default (no SDK provider configured): the driver checks once per drive
whether a provider is there. On installs the SDK's tracer and meter providers with
in-memory exporters, so every drive's spans and points are derived from its history
(one store read per drive) and handed over. Each runs REPS times on a fresh SQLite
file, off first (a process sets its providers once); the check itself is timed alone.

    python bench/otel_overhead.py [--n 100] [--reps 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

import trio
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

sys.path.insert(0, str(Path(__file__).parent))
from turn_overhead import T, ours

from loop_actors.telemetry import current_trace_parent, telemetry_on


def _install() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    return exporter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the database files go")
    args = parser.parse_args()

    calls = 100_000
    check_us = timeit.timeit(telemetry_on, number=calls) / calls * 1e6
    parent_us = timeit.timeit(current_trace_parent, number=calls) / calls * 1e6
    off_s: list[float] = []
    on_s: list[float] = []
    exporter: InMemorySpanExporter | None = None
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        trio.run(ours, Path(tmp) / "warmup.db", 2)
        for rep in range(args.reps):
            off_s.append(trio.run(ours, Path(tmp) / f"off-{rep}.db", args.n))
        exporter = _install()
        for rep in range(args.reps):
            on_s.append(trio.run(ours, Path(tmp) / f"on-{rep}.db", args.n))
    turns = args.n * T
    spans = len(exporter.get_finished_spans()) if exporter is not None else 0
    per_turn = {
        name: statistics.median(s) / turns * 1e6 for name, s in (("off", off_s), ("on", on_s))
    }
    print(f"workload: {args.n} invocations x {T} turns, {args.reps} repetitions each way")
    print(f"the check per drive (off)  : {check_us:6.2f} us")
    print(f"trace parent per run (off) : {parent_us:6.2f} us")
    print(f"tracing off                : {per_turn['off']:8.0f} us/turn (median)")
    print(f"tracing on (in-memory SDK) : {per_turn['on']:8.0f} us/turn (median)")
    print(f"spans exported while on    : {spans:,} ({spans / (args.n * args.reps):.0f} per run)")


if __name__ == "__main__":
    main()
