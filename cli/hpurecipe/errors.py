"""Domain errors → one line on stderr and an exit code, in one place (usage errors exit 2, the rest 1)."""

from __future__ import annotations

import functools
import sys
import traceback
from typing import Callable

import typer
import typer.core
from rich.markup import escape

from hpu_backend import envs
from hpu_backend.shipping.bundles import BundleError
from hpu_backend.buckets import BucketError
from hpu_backend.modelfiles.modelspec import ModelFileError
from hpu_backend.errors import one_line
from hpu_backend.formats.package import PackageError
from hpu_backend.formats.precompiled import PrecompileError
from hpu_backend.run.errors import RunError
from hpu_backend.settings import SettingsError
from recipecache import CacheError, ConfigError
from recipecache.signing import SigningKeyError

from .render import clean, err_console
from hpu_backend.errors import HpuBackendError


class CliError(HpuBackendError):
    """A failure the user can act on; ``code`` is the exit code (1 failure, 2 usage)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class UsageError(CliError):
    def __init__(self, message: str):
        super().__init__(message, 2)


# Most specific first: ConfigError is a CacheError, SettingsError and BucketError are ValueErrors.
EXIT_CODES: list[tuple[type[BaseException], int]] = [
    (ConfigError, 2), (BucketError, 2), (SettingsError, 2), (ModelFileError, 1), (PackageError, 1),
    (PrecompileError, 1), (SigningKeyError, 1), (CacheError, 1),
    (BundleError, 1),
]


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(clean(message))}", markup=True, highlight=False, soft_wrap=True)
    return typer.Exit(code)


TRACEBACK_ENV = "HPURECIPE_TRACEBACK"


def mapped(fn: Callable) -> Callable:
    """Run a command, turning our named errors into one line and an exit code instead of a traceback.

    Anything else is a bug of ours (or an environment we did not foresee): still one line, with the
    way to get the traceback (``HPURECIPE_TRACEBACK=1``) for a report. With that switch, named errors
    also print their traceback (and their cause's: a model file's own exception) before their line.
    """

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (CliError, RunError) as e:
            _traceback(e)
            raise fail(str(e), e.code) from None
        except tuple(cls for cls, _ in EXIT_CODES) as e:
            _traceback(e)  # with the model's own exception it wraps, if any
            code = next(c for cls, c in EXIT_CODES if isinstance(e, cls))
            raise fail(str(e), code) from None
        except (typer.Exit, typer.Abort):
            raise
        except OSError as e:  # a disk, permission or path problem the command did not expect
            if envs.get(TRACEBACK_ENV):
                raise
            raise fail(f"{e.filename + ': ' if e.filename else ''}{e.strerror or one_line(e)}") from None
        except Exception as e:
            if envs.get(TRACEBACK_ENV) or type(e).__module__.split(".")[0] in ("typer", "click"):
                raise
            raise fail(f"unexpected {one_line(e)} (run with {TRACEBACK_ENV}=1 to see where)") from None

    return run


def _traceback(e: BaseException) -> None:
    """With HPURECIPE_TRACEBACK=1, the traceback of a named error (and of what caused it) before its one line."""
    if envs.get(TRACEBACK_ENV):
        traceback.print_exception(e, file=sys.stderr)


class OneLineUsage(typer.core.TyperGroup):
    """The command group: a usage error (missing argument, unknown option or command, a value typer cannot
    parse) is one ``error:`` line naming the command's --help, exit 2, where click would draw a box."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Abort:
            code = fail("aborted", 1).exit_code
        except typer.TyperException as e:  # typer's click: usage errors and bad values, whose help is a box
            code = getattr(e, "exit_code", 2)
            if type(e).__name__ != "NoArgsIsHelpError":  # that one has printed the help already
                ctx = getattr(e, "ctx", None)
                see = f" (see {ctx.command_path} --help)" if ctx is not None else ""
                fail(f"{e.format_message()}{see}", code)
        sys.exit(code if isinstance(code, int) else 0)  # a command returns None; typer.Exit returns its code
