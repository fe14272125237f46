"""The ``tileship`` command. One small module per command; heavy imports inside handlers."""

from __future__ import annotations

import typer

from tileship.cli import (
    build_cmd,
    check_cmd,
    demo_cmd,
    diagnose_cmd,
    image_cmd,
    lock_cmd,
    promote_cmd,
    propose_cmd,
    registry_cmd,
    serve_cmd,
    sign_cmd,
    toolchain_cmd,
    tune_cmd,
    verify_cmd,
)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Ship TileLang kernels: lock, build, verify, serve, roll back.")
for module in (lock_cmd, check_cmd, build_cmd, sign_cmd, demo_cmd, registry_cmd, diagnose_cmd, serve_cmd, verify_cmd,
               toolchain_cmd, image_cmd, tune_cmd, propose_cmd, promote_cmd):
    module.register(app)


def main() -> None:
    app()
