"""The torch worker's CPU time (runtime/node/stage.py): where nodes share cores, what their work costs there,
apart from the wall time that counts the waiting for a core."""

from __future__ import annotations

import time

import trio

from gwtf_node.runtime.node.stage import LocalStage


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_compute_and_work_count_the_worker_threads_cpu_not_its_waits() -> None:
    stage = LocalStage(manifest=None, role="relay", device="cpu", data_index=0, data_nodes=1)

    def commit_many(seconds: float) -> None:
        _spin(seconds)

    async def main() -> None:
        await stage.compute(_spin, 0.2)
        await stage.compute(time.sleep, 0.3)  # waiting: wall time, no CPU
        await stage.run(commit_many, 0.1)
        await stage.run(commit_many, 0.1)
        await stage.run(time.sleep, 0.2)

    trio.run(main)
    assert stage.compute_s >= 0.5
    assert 0.19 <= stage.compute_cpu_s <= 0.3
    assert 0.19 <= stage.work_cpu_s["commit_many"] <= 0.3  # every call's, where work_s keeps the last's
    assert stage.work_cpu_s["sleep"] < 0.05
    st = stage.status()
    assert st.compute_cpu_s == stage.compute_cpu_s and st.work_cpu_s == stage.work_cpu_s
    assert st.aggregation_cpu_s == 0.0
