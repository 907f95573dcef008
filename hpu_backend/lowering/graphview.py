"""A read-only view of a recipe's dataflow for the fusion passes: producers, users, schedule order."""

from __future__ import annotations

from collections import deque

from ..formats.recipe import Node, Recipe, iter_refs
from .values import node_refs


class GraphView:
    def __init__(self, recipe: Recipe):
        self.nodes: dict[str, Node] = {n.name: n for n in recipe.nodes}
        self.order = {n.name: i for i, n in enumerate(recipe.nodes)}
        self.inputs = {n.name: [r for r in node_refs(n) if r in self.nodes] for n in recipe.nodes}
        self.users: dict[str, list[str]] = {n.name: [] for n in recipe.nodes}
        for name, refs in self.inputs.items():
            for r in refs:
                self.users[r].append(name)
        self.outputs = set(iter_refs(recipe.outputs))

    def descendants(self, start: str, until: int) -> set[str]:
        """Nodes reachable from ``start`` that are scheduled no later than index ``until``."""
        return self._walk(start, self.users, lambda n: self.order[n] <= until)

    def ancestors(self, start: str, since: int) -> set[str]:
        """Nodes ``start`` depends on that are scheduled no earlier than index ``since``."""
        return self._walk(start, self.inputs, lambda n: self.order[n] >= since)

    def _walk(self, start: str, edges: dict[str, list[str]], keep) -> set[str]:
        seen, todo = set(), deque([start])
        while todo:
            for nxt in edges[todo.popleft()]:
                if nxt not in seen and keep(nxt):
                    seen.add(nxt)
                    todo.append(nxt)
        return seen
