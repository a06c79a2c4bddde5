"""The Runtime's GC policy: thresholds set while it is open, the previous ones put back after."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from loop_actors import GcPolicy, Runtime, UsageError
from tests.support.cli import run_cli

BEFORE = (701, 11, 12)
"""The application's own thresholds, distinct from the interpreter's defaults."""


@pytest.fixture(autouse=True)
def own_thresholds(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("LOOP_ACTORS_GC", raising=False)
    saved = gc.get_threshold()
    gc.set_threshold(*BEFORE)
    yield
    gc.set_threshold(*saved)


def _url(tmp_path: Path, name: str = "gc.db") -> str:
    return f"sqlite:///{tmp_path / name}"


async def test_the_hosting_thresholds_apply_while_open_and_the_previous_ones_after(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with Runtime(_url(tmp_path)):
            assert gc.get_threshold() == GcPolicy.HOSTING.thresholds
        assert gc.get_threshold() == BEFORE


async def test_the_previous_thresholds_come_back_when_the_body_raises(tmp_path: Path) -> None:
    async def fail_inside() -> None:
        async with Runtime(_url(tmp_path), gc_policy=GcPolicy((5000, 7, 9))):
            assert gc.get_threshold() == (5000, 7, 9)
            raise ZeroDivisionError

    with trio.fail_after(30), pytest.raises(ZeroDivisionError):
        await fail_inside()
    assert gc.get_threshold() == BEFORE


async def test_the_previous_thresholds_come_back_when_opening_fails(tmp_path: Path) -> None:
    """Opening fails after the policy was applied (the checkpoint key cannot be read)."""
    runtime = Runtime(
        _url(tmp_path),
        checkpoint_dir=tmp_path / "checkpoints",
        checkpoint_key=tmp_path / "no-such.key",
    )
    with trio.fail_after(30), pytest.raises(UsageError):
        await runtime.__aenter__()
    assert gc.get_threshold() == BEFORE


async def test_two_runtimes_open_at_once_put_the_thresholds_back_when_the_last_closes(
    tmp_path: Path,
) -> None:
    """The first one closes while the second is open: the second's thresholds stay."""
    close = [trio.Event(), trio.Event()]
    opened = [trio.Event(), trio.Event()]
    closed = [trio.Event(), trio.Event()]

    async def host(index: int, policy: GcPolicy) -> None:
        async with Runtime(_url(tmp_path, f"{index}.db"), gc_policy=policy):
            opened[index].set()
            await close[index].wait()
        closed[index].set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(host, 0, GcPolicy((3000, 5, 5)))
            await opened[0].wait()
            assert gc.get_threshold() == (3000, 5, 5)
            nursery.start_soon(host, 1, GcPolicy((4000, 6, 6)))
            await opened[1].wait()
            assert gc.get_threshold() == (4000, 6, 6)
            close[0].set()
            await closed[0].wait()
            assert gc.get_threshold() == (4000, 6, 6)
            close[1].set()
    assert gc.get_threshold() == BEFORE


async def test_closing_a_nested_runtime_gives_the_outer_ones_thresholds_back(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with Runtime(_url(tmp_path, "a.db"), gc_policy=GcPolicy((3000, 5, 5))):
            async with Runtime(_url(tmp_path, "b.db")):
                assert gc.get_threshold() == GcPolicy.HOSTING.thresholds
            assert gc.get_threshold() == (3000, 5, 5)
    assert gc.get_threshold() == BEFORE


async def test_runtimes_open_in_two_threads_put_the_thresholds_back_once_both_closed(
    tmp_path: Path,
) -> None:
    """Each thread runs its own trio loop; the holds are shared by the process."""
    opened = [threading.Event() for _ in range(2)]
    done = threading.Event()

    def host(index: int) -> None:
        async def body() -> None:
            async with Runtime(_url(tmp_path, f"t{index}.db")):
                opened[index].set()
                await trio.to_thread.run_sync(done.wait, 30)

        trio.run(body)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for index in range(2):
                nursery.start_soon(trio.to_thread.run_sync, host, index)
            for event in opened:
                assert await trio.to_thread.run_sync(event.wait, 30)
            assert gc.get_threshold() == GcPolicy.HOSTING.thresholds
            done.set()
    assert gc.get_threshold() == BEFORE


async def test_the_unchanged_policy_leaves_the_thresholds_alone(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with Runtime(_url(tmp_path), gc_policy=GcPolicy.UNCHANGED):
            assert gc.get_threshold() == BEFORE
    assert gc.get_threshold() == BEFORE


async def test_the_environment_variable_chooses_the_policy_when_none_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOP_ACTORS_GC", "20000, 10, 10")
    assert Runtime(_url(tmp_path)).gc_policy == GcPolicy((20000, 10, 10))
    monkeypatch.setenv("LOOP_ACTORS_GC", "unchanged")
    assert Runtime(_url(tmp_path)).gc_policy == GcPolicy.UNCHANGED
    assert Runtime(_url(tmp_path), gc_policy=GcPolicy.HOSTING).gc_policy == GcPolicy.HOSTING


@pytest.mark.parametrize("text", ["fast", "1,2", "0,10,10", "1,2,x", "-1,2,3"])
def test_an_environment_variable_that_names_no_policy_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("LOOP_ACTORS_GC", text)
    with pytest.raises(UsageError, match=r"LOOP_ACTORS_GC|GC thresholds"):
        Runtime(_url(tmp_path))


@pytest.mark.parametrize("thresholds", [(0, 10, 10), (700, 10), (700.0, 10, 10), (True, 1, 1)])
def test_thresholds_that_are_not_three_whole_numbers_of_at_least_one_are_refused(
    thresholds: object,
) -> None:
    with pytest.raises(UsageError, match="GC thresholds"):
        GcPolicy(thresholds)  # type: ignore[arg-type]


def test_a_gc_policy_that_is_not_a_gc_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="gc_policy must be a GcPolicy"):
        Runtime(_url(tmp_path), gc_policy="hosting")  # type: ignore[arg-type]


def test_the_cli_refuses_a_bad_gc_variable_before_running(tmp_path: Path) -> None:
    done = run_cli("demo", cwd=tmp_path, db=_url(tmp_path), env={"LOOP_ACTORS_GC": "fast"})
    assert done.returncode == 2, done.stderr
    assert "LOOP_ACTORS_GC" in done.stderr
    assert not (tmp_path / "gc.db").exists()
