"""pytest-benchmark front end of fastq's side-by-side benchmark.

Run with ``pytest benchmarks/ --benchmark-only`` (the default ``pytest`` run
collects tests/ only). Cases run in this process, through the same machinery
as ``python -m fastq bench`` (fastq/_bench); every case's batches/s, GB/s and
per-batch counters go to its ``extra_info`` and to a summary table at the end.
Choose what runs with --bench-shapes, --bench-transports, --bench-workers,
--bench-slots and --bench-seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fastq._bench import report
from fastq._bench.measure import Budget, Meter, Options, Result, started
from fastq._bench.transports import AUTO, TRANSPORTS, Case
from fastq._bench.workloads import SHAPES

_RESULTS = pytest.StashKey[list[tuple[str, Result]]]()
# Tables of benchmarks measured otherwise (title, a function that renders it).
_TABLES = pytest.StashKey[dict[str, Callable[[], str]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("fastq benchmarks")
    g.addoption(
        "--bench-shapes",
        default=",".join(SHAPES),
        help=f"comma-separated shapes ({','.join(SHAPES)})",
    )
    g.addoption(
        "--bench-transports",
        default=",".join(TRANSPORTS),
        help=f"comma-separated transports ({','.join(TRANSPORTS)})",
    )
    g.addoption("--bench-workers", default="1,2", help="comma-separated worker counts")
    g.addoption(
        "--bench-slots",
        type=int,
        default=None,
        help="batches in flight (default: 2 per worker)",
    )
    g.addoption(
        "--bench-seconds",
        type=float,
        default=2.0,
        help="measured seconds per case, after warm-up",
    )


def _csv(config: pytest.Config, name: str) -> list[str]:
    return [x.strip() for x in str(config.getoption(name)).split(",") if x.strip()]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Timings need the machine to themselves: one process, whatever the
    # project's addopts say for the tests (pytest-xdist's -n).
    if getattr(config.option, "numprocesses", None):
        config.option.numprocesses = 0
        config.option.dist = "no"
    config.stash[_RESULTS] = []
    config.stash[_TABLES] = {}


def _wants(metafunc: pytest.Metafunc, name: str) -> bool:
    """The test takes `name` and does not parametrize it itself."""
    if name not in metafunc.fixturenames:
        return False
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return False
    return True


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    if _wants(metafunc, "shape"):
        metafunc.parametrize("shape", _csv(config, "--bench-shapes"))
    if _wants(metafunc, "workers"):
        metafunc.parametrize(
            "workers", [int(w) for w in _csv(config, "--bench-workers")]
        )
    if _wants(metafunc, "transport"):
        wanted = _csv(config, "--bench-transports")
        unknown = [t for t in wanted if t not in TRANSPORTS]
        if unknown:
            raise pytest.UsageError(
                f"--bench-transports: unknown {unknown}; choose from {list(TRANSPORTS)}"
            )
        metafunc.parametrize("transport", wanted)


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    if config.getoption("benchmark_only", False):
        return
    skip = pytest.mark.skip(
        reason="benchmarks: run `pytest benchmarks/ --benchmark-only`"
    )
    for item in items:
        item.add_marker(skip)


@pytest.fixture
def budget(request: pytest.FixtureRequest) -> Budget:
    return Budget(seconds=float(request.config.getoption("--bench-seconds")))


@pytest.fixture
def slots(request: pytest.FixtureRequest) -> int | None:
    value = request.config.getoption("--bench-slots")
    return None if value is None else int(value)


def skip_if_missing(transport: str, compute_bound: bool = False) -> None:
    """Optional transports (torch, faster-fifo, spdl, torchdata) are skipped,
    saying why; workers="auto" runs in the compute-bound cases alone."""
    why = TRANSPORTS[transport].missing()
    if why:
        pytest.skip(why)
    if transport == AUTO and not compute_bound:
        pytest.skip(f"{transport}: measured in the compute-bound cases alone")


@pytest.fixture
def record(request: pytest.FixtureRequest, benchmark: Any) -> Any:
    """record(section, result): the result goes to extra_info and to the
    summary table."""

    def add(section: str, result: Result) -> None:
        benchmark.extra_info.update(
            transport=result.label,
            batches_per_s=round(result.batches_per_s, 2),
            gb_per_s=round(result.gb_per_s, 3),
            us_per_batch=round(result.us_per_batch, 2),
            batch_bytes=result.batch_bytes,
            first_batch_s=round(result.first_batch_s, 3),
            consumer_cpu_us_per_batch=round(result.consumer.cpu_us, 1),
            consumer_faults_per_batch=round(result.consumer.minflt, 3),
            producer_faults_per_batch=round(result.producers.minflt, 3),
            pss_mb=round(result.pss_bytes / 1e6, 1),
            latency_us=result.latency_us,
            syscalls_per_batch=[result.consumer.syscalls, result.producers.syscalls],
            case=result.case,
            notes=result.notes,
        )
        request.config.stash[_RESULTS].append((section, result))

    return add


def measure_blocks(
    benchmark: Any, case: Case, budget: Budget, options: Options | None = None
) -> Result:
    """Starts the case, warms up, then lets pytest-benchmark time
    budget.blocks rounds of the same number of batches each."""
    with started(case, options) as meter:
        per_block = meter.warm_up(budget)
        meter.start_counting()
        benchmark.pedantic(
            meter.block, args=(per_block,), rounds=budget.blocks, iterations=1
        )
        benchmark.extra_info["batches_per_round"] = per_block
        return meter.stop_counting()


@pytest.fixture
def meter_factory() -> Iterator[Any]:
    """started() as a fixture, for tests that drive a Meter themselves."""
    opened: list[Any] = []

    def start(case: Case, options: Options | None = None) -> Meter:
        cm = started(case, options)
        opened.append(cm)
        return cm.__enter__()

    yield start
    for cm in reversed(opened):
        cm.__exit__(None, None, None)


@pytest.fixture
def summary_table(request: pytest.FixtureRequest) -> Any:
    """summary_table(title, render): render() is printed under `title` in
    the summary at the end (once per title, however many tests add it)."""

    def add(title: str, render: Callable[[], str]) -> None:
        request.config.stash[_TABLES][title] = render

    return add


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    tr = terminalreporter
    for title, render in config.stash.get(_TABLES, {}).items():
        tr.section(title)
        tr.write_line(f"machine: {report.machine()}")
        for line in render().splitlines():
            tr.write_line(line)
    collected = config.stash.get(_RESULTS, [])
    if not collected:
        return
    tr.section("fastq side by side")
    tr.write_line(f"machine: {report.machine()}")
    groups: dict[tuple[str, str, int], list[Result]] = {}
    for section, r in collected:
        key = (section, str(r.case["workload"]), int(r.case["workers"]))
        groups.setdefault(key, []).append(r)
    order = {t: i for i, t in enumerate(TRANSPORTS)}
    for (section, shape, workers), rs in groups.items():
        rs.sort(key=lambda r: order[str(r.case["transport"])])
        tr.write_line("")
        tr.write_line(
            f"[{section}] " + report.heading(shape, workers, int(rs[0].case["slots"]))
        )
        table = {
            "latency": report.latency_table,
            "handover": report.handover_table,
            "startup": report.startup_table,
            "steady": report.steady_table,
        }.get(section, report.throughput_table)
        for line in table(rs).splitlines():
            tr.write_line(line)
