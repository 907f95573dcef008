"""Which cache configuration the tools work on: the backend's own (its environment variable), at another
directory if asked, with the size limit and policy recorded by the processes that filled it. Torch-free."""

from __future__ import annotations

from pathlib import Path

from recipecache import CacheConfig, ConfigError
from recipecache.config import ENV_VAR, recorded

from .. import envs


def config_for(cache_dir: Path | None, remote: str | None = None) -> CacheConfig:
    """The backend's cache configuration (its environment variable, ENV_VAR), at ``cache_dir`` if given.

    The size limit and eviction policy are the variable's when it names this directory,
    else those recorded in the directory by the processes that filled it (else the defaults). The
    tools never delete on start: that is for serving processes that ask for it.
    """
    base = CacheConfig.from_env()
    path = Path(cache_dir or base.path).expanduser()
    if envs.is_set(ENV_VAR) and path == Path(base.path):
        return CacheConfig(path=path, max_size_mb=base.max_size_mb, policy=base.policy, remote=remote or "")
    return CacheConfig(path=path, remote=remote or "", **(recorded(path) or {}))


def config_to_fill(cache_dir: Path | None, command: str) -> CacheConfig:
    """``config_for(cache_dir)`` for a command that stores recipes; ConfigError if that cache is disabled."""
    config = config_for(cache_dir)
    if config.max_size_mb == 0:
        raise ConfigError(f"the recipe cache is disabled (max_size_mb 0), so {command} has nowhere to store "
                          f"recipes; give it a size in {ENV_VAR}")
    return config


def recipe_problem(payload: bytes) -> str | None:
    """Why an intact entry's payload is not a usable recipe or program of this format, or None (the checks
    serving makes when it reads one: schema, references, buckets, guards, and the inputs its ops write
    against those it declares; and, for a program, that its templates' guards evaluate at a probe size, as
    each new size of a call evaluates them)."""
    from ..formats.program import Program, parse_payload
    from ..formats.recipe import RecipeFormatError
    from ..formats.writes import declaration_problem

    try:
        parsed = parse_payload(payload)
    except RecipeFormatError as e:
        return f"not a recipe: {e}"
    recipes = [g.template for g in parsed.graphs] if isinstance(parsed, Program) else [parsed]
    problem = next((problem for r in recipes if (problem := declaration_problem(r))), None)
    if problem is None and isinstance(parsed, Program):
        problem = _template_guard_problem(parsed)
    return problem


def _template_guard_problem(program) -> str | None:
    """Why a guard of one of the program's templates cannot be evaluated (e.g. a huge power), or None."""
    from ..formats import symexpr
    from ..formats.program import GUARD_PROBE

    for g in program.graphs:
        env = dict.fromkeys(g.template.symbols, GUARD_PROBE)
        for tree in g.template.guards:
            try:
                symexpr.evaluate(tree, env)
            except (symexpr.SymExprError, ArithmeticError, TypeError, ValueError) as e:
                return f"not a recipe: the {g.template.kind} template's guard {symexpr.to_str(tree):.80} cannot " \
                       f"be evaluated ({type(e).__name__})"
    return None
