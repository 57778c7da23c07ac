"""Estimator: storage-alias tracking with byte counts computed by hand (float32 = 4 bytes)."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from lightning_memplan.forecasting.estimator import (
    GraphStorages,
    MemoryReplay,
    profile_graph,
)

F32 = 4


def trace(fn, *shapes):  # noqa: ANN001, ANN002, ANN201 - test helper
    args = [torch.randn(*s) for s in shapes]
    return make_fx(fn, tracing_mode="fake")(*args).graph


def test_view_shares_storage_and_storage_freed_after_last_use() -> None:
    def f(x):  # noqa: ANN001, ANN202
        a = x * 2          # 32*32 floats = 4096 B
        b = a.view(-1)     # no new storage
        return b + 1       # 4096 B; `a` freed after this reads it

    prof = profile_graph(trace(f, (32, 32)))
    n = 32 * 32 * F32
    assert prof.start_bytes == 0  # x is baseline (a primal)
    assert prof.timeline == (n, n, 2 * n)
    assert prof.peak_bytes == 2 * n
    assert prof.end_bytes == n  # only the output stays


def test_inplace_op_allocates_nothing() -> None:
    def f(x):  # noqa: ANN001, ANN202
        a = x * 2
        a.add_(1)
        return a.sum()

    prof = profile_graph(trace(f, (16, 16)))
    n = 16 * 16 * F32
    assert prof.timeline == (n, n, n + F32)
    assert prof.end_bytes == F32


def test_output_aliasing_an_input_is_not_counted() -> None:
    def f(x):  # noqa: ANN001, ANN202
        return x.view(-1), x * 3

    prof = profile_graph(trace(f, (8, 8)))
    assert prof.peak_bytes == 8 * 8 * F32
    assert prof.end_bytes == 8 * 8 * F32


def test_multi_output_storages_live_until_last_getitem() -> None:
    def f(x):  # noqa: ANN001, ANN202
        v, i = x.max(0)    # values 32 floats (128 B) + indices 32 int64 (256 B)
        return v * 2       # 128 B; the unused indices died after the last getitem

    prof = profile_graph(trace(f, (32, 32)))
    values, indices = 32 * F32, 32 * 8
    assert prof.order == ("max_1", "getitem", "getitem_1", "mul")
    assert prof.timeline == (values + indices,) * 3 + (2 * values,)
    assert prof.end_bytes == values


def test_live_inputs_count_from_start_and_are_freed() -> None:
    def f(saved, other):  # noqa: ANN001, ANN202
        return (saved * other).sum()

    graph = trace(f, (10, 10), (10, 10))
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    n = 10 * 10 * F32
    prof = profile_graph(graph, live_inputs=[names[0]])
    assert prof.start_bytes == n
    assert prof.peak_bytes == 2 * n  # saved + the product
    assert prof.end_bytes == F32  # saved and product freed, the scalar stays


def test_replay_any_valid_order_changes_the_peak() -> None:
    def f(x):  # noqa: ANN001, ANN202
        a = x * 2
        b = a.sum()        # a dies here in graph order
        c = x * 3
        d = c.sum()
        return b + d

    graph = trace(f, (64, 64))
    n = 64 * 64 * F32
    order = [nd.name for nd in graph.nodes if nd.op == "call_function"]
    assert profile_graph(graph, order=order).peak_bytes == n + 2 * F32  # c, b and d
    mul, s1, mul2, s2, add = order
    late = profile_graph(graph, order=[mul, mul2, s1, s2, add])  # both products live at once
    assert late.peak_bytes == 2 * n + F32  # a, c and b at sum_1


def test_replay_rejects_invalid_orders() -> None:
    def f(x):  # noqa: ANN001, ANN202
        return (x * 2).sum()

    graph = trace(f, (4, 4))
    mul, total = [nd.name for nd in graph.nodes if nd.op == "call_function"]
    replay = MemoryReplay(GraphStorages(graph))
    with pytest.raises(ValueError, match=r"before its inputs \['mul'\]"):
        replay.run(total)
    replay.run(mul)
    with pytest.raises(ValueError, match=r"already run"):
        replay.run(mul)
    with pytest.raises(ValueError, match=r"no such node"):
        replay.run("nope")


def test_device_filter() -> None:
    def f(x):  # noqa: ANN001, ANN202
        return x * 2

    graph = trace(f, (8, 8))
    assert profile_graph(graph, devices=["cuda"]).peak_bytes == 0
    assert profile_graph(graph, devices=["cpu"]).peak_bytes == 8 * 8 * F32
