"""gateway.plan.executors: the Ray adapter's calls, against a fake ``ray`` module (a real
cluster: tests/integration/test_plan_ray.py, opt-in)."""

from __future__ import annotations

import sys
import types
from concurrent.futures import Future
from typing import Any

import pytest

from gateway.plan.executors import LOCAL, RayExecutor, local_executor


class _Ref:
    def __init__(self, value: Any) -> None:
        self._value = value

    def future(self) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(self._value)
        return done


def _fake_ray(fail: Exception | None = None) -> tuple[types.ModuleType, list[Any]]:
    calls: list[Any] = []
    ray = types.ModuleType("ray")

    def init(**kwargs: Any) -> None:
        calls.append(("init", kwargs))
        if fail is not None:
            raise fail

    def remote(**options: Any) -> Any:
        def wrap(fn: Any) -> Any:
            task = types.SimpleNamespace(remote=lambda *a, **k: _Ref(fn(*a, **k)))
            calls.append(("remote", options))
            return task
        return wrap

    ray.init = init  # type: ignore[attr-defined]
    ray.remote = remote  # type: ignore[attr-defined]
    ray.shutdown = lambda: calls.append(("shutdown",))  # type: ignore[attr-defined]
    return ray, calls


def test_replays_go_to_the_cluster_as_tasks_of_one_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    ray, calls = _fake_ray()
    monkeypatch.setitem(sys.modules, "ray", ray)
    with RayExecutor("ray://head:10001") as executor:
        assert executor.submit(pow, 2, 10).result() == 1024
    assert calls[0][0] == "init" and calls[0][1]["address"] == "ray://head:10001"
    assert calls[1] == ("remote", {"num_cpus": 1.0}) and calls[-1] == ("shutdown",)


def test_local_starts_an_instance_and_failures_are_value_errors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ray, calls = _fake_ray()
    monkeypatch.setitem(sys.modules, "ray", ray)
    RayExecutor(LOCAL).shutdown()
    assert calls[0][1]["address"] is None
    ray, _ = _fake_ray(ConnectionError("no GCS at head:6379"))
    monkeypatch.setitem(sys.modules, "ray", ray)
    with pytest.raises(ValueError, match="--ray head:6379: no GCS"):
        RayExecutor("head:6379")


def test_without_ray_installed_the_error_says_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'ridge\[ray\]'"):
        RayExecutor(LOCAL)


def test_local_processes_run_module_level_functions() -> None:
    with local_executor(1) as executor:
        assert executor.submit(pow, 3, 3).result() == 27
