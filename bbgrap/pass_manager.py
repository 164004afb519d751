"""Pass infrastructure, after onnx-ir's: a pass is a small class with
`call(graph) -> PassResult` and optional `requires`/`ensures` checks; a
`PassManager` runs a sequence, checks the IR's invariants after every pass and can
dump the IR after any pass. A failure names the pass and the passes before it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

from bbgrap.invariants import check_invariants
from bbgrap.ir import BBGrapError, Graph


@dataclass(frozen=True)
class PassResult:
    graph: Graph
    modified: bool


class PassError(Exception):
    """A pass failed, or left the IR broken: an internal error, not the user's."""


class Pass(ABC):
    name: ClassVar[str]

    def requires(self, graph: Graph) -> None:
        """Raise PassError if the graph is not fit for this pass."""

    def ensures(self, graph: Graph) -> None:
        """Raise PassError if the pass did not do its job."""

    @abstractmethod
    def call(self, graph: Graph) -> PassResult: ...

    def __call__(self, graph: Graph) -> PassResult:
        self.requires(graph)
        result = self.call(graph)
        self.ensures(result.graph)
        return result


class PassManager:
    """Runs passes in order; see module docstring."""

    def __init__(
        self,
        passes: Sequence[Pass],
        check: bool = True,
        dump_after: Sequence[str] = (),
        dump: Callable[[str, Graph], None] | None = None,
    ) -> None:
        names = [p.name for p in passes]
        unknown = [d for d in dump_after if d not in names]
        if unknown:
            raise BBGrapError(f"--dump-ir-after {unknown[0]}: no such pass in this pipeline ({', '.join(names)})")
        self.passes = list(passes)
        self.check = check
        self.dump_after = set(dump_after)
        self.dump = dump

    def run(self, graph: Graph) -> Graph:
        done: list[str] = []
        for p in self.passes:
            where = f"pass '{p.name}'" + (f" (after {', '.join(done)})" if done else " (first pass)")
            try:
                graph = p(graph).graph
            except BBGrapError:
                raise
            except Exception as exc:
                raise PassError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
            if self.check:
                problems = check_invariants(graph)
                if problems:
                    raise PassError(f"{where} broke the IR's invariants: " + "; ".join(problems[:5]))
            done.append(p.name)
            if self.dump is not None and p.name in self.dump_after:
                self.dump(p.name, graph)
        return graph
