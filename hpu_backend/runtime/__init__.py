"""The simulated device: recipes become host callables; bucket dispatch per call."""

from .executor import RecipeLoadError, build_callable, check_ops
from .ops import OpNotAllowed, is_allowed, resolve

__all__ = ["RecipeLoadError", "build_callable", "check_ops", "OpNotAllowed", "is_allowed", "resolve"]
