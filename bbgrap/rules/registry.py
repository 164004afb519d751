"""The default registry: every op family shipped with BBGraP, registered into one
`RuleRegistry` (`base.py`). A family module registers its ops; this module only composes
the families, so it imports them and they never import it."""

from __future__ import annotations

import functools

from bbgrap.rules import conv, elementwise, indexing, pool, reduce, structural
from bbgrap.rules.base import RuleRegistry

__all__ = ["RuleRegistry", "default_registry"]


@functools.cache
def default_registry() -> RuleRegistry:
    """The registry of every rule family shipped with BBGraP (built once, never mutated after)."""
    registry = RuleRegistry()
    for family in (conv, pool, elementwise, structural, reduce, indexing):
        family.register(registry)
    return registry
