"""Strongly connected components of a small directed graph (pure).

Invariants: the result is one function of the graph (nodes and successors are visited in sorted
order), whatever order the caller built it in; nothing here recurses, so depth is no limit.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Protocol, TypeVar


class Ordered(Hashable, Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


N = TypeVar("N", bound=Ordered)


def source_components(nodes: Sequence[N], edges: Mapping[N, Sequence[N]]) -> list[list[N]]:
    """The strongly connected components of ``nodes`` that no edge from another component enters
    (Tarjan's algorithm, iterative, in sorted order so the result is one function of the graph)."""
    index: dict[N, int] = {}
    low: dict[N, int] = {}
    comp_of: dict[N, int] = {}
    comps: list[list[N]] = []
    stack: list[N] = []
    on: set[N] = set()
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, k = work.pop()
            if k == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on.add(v)
            succ = sorted(edges[v])
            if k < len(succ):
                work.append((v, k + 1))
                w = succ[k]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp: list[N] = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp_of[w] = len(comps)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    entered = {comp_of[w] for v in nodes for w in edges[v] if comp_of[w] != comp_of[v]}
    return [c for n, c in enumerate(comps) if n not in entered]
