"""The default registry: every op family shipped with BBGraP, registered into one
`RuleRegistry` (`base.py`). A family module registers its ops; this module only composes
the families, so it imports them and they never import it."""

from __future__ import annotations

import functools

from bbgrap.rules import conv, elementwise, indexing, pool, reduce, structural
from bbgrap.rules.base import RuleRegistry

__all__ = ["FAMILIES", "RuleRegistry", "build_default_registry", "default_registry"]

FAMILIES = (conv, pool, elementwise, structural, reduce, indexing)
"""Every rule family shipped with BBGraP, in registration order."""


def build_default_registry() -> RuleRegistry:
    """A new registry holding every family shipped with BBGraP, built as the default one is."""
    registry = RuleRegistry()
    for family in FAMILIES:
        family.register(registry)
    return registry


@functools.cache
def default_registry() -> RuleRegistry:
    """The registry of every rule family shipped with BBGraP (built once, never mutated after)."""
    return build_default_registry()
