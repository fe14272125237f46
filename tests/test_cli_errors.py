"""What the CLI prints when something is wrong: the error, named, never a traceback or the wrong thing done.

Messages, hints, reasons and lock values come from outside (a project file, a lock, a path); they print as
written, never read as rich markup: ``[tool.tileship]`` stays, ``[/`` does not raise."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from tileship.cli import app


@pytest.mark.parametrize("command", ["build", "lock", "promote"])
def test_a_project_path_that_does_not_exist_is_an_error_not_the_builtin_catalog(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where `lock` would write tileship.lock
    missing = tmp_path / "tileship-typo.toml"
    res = CliRunner().invoke(app, [command, "--project", str(missing)])
    assert res.exit_code == 1, res.output
    assert "no such project file or directory" in res.output and "tileship-typo.toml" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_message_naming_a_toml_table_prints_the_table_name(tmp_path):
    """It printed "error: .routing: must be ...": rich took "[tool.tileship]" for a style."""
    proj = tmp_path / "pyproject.toml"
    proj.write_text('[tool.tileship]\nmodel = "m"\noperators = ["x"]\nrouting = "sideways"\n')
    res = CliRunner().invoke(app, ["lock", "--project", str(tmp_path), "--out", str(tmp_path / "t.lock")])
    assert res.exit_code == 1, res.output
    assert "[tool.tileship].routing" in res.output and "sideways" in res.output, res.output
    assert not (tmp_path / "t.lock").exists()


def test_lock_values_that_look_like_markup_print_as_written(tmp_path):
    """A lock is outside text: a value "[/]" raised rich's MarkupError out of `tileship check`."""
    out = tmp_path / "t.lock"
    res = CliRunner().invoke(app, ["lock", "--out", str(out)])
    assert res.exit_code == 0, res.output
    lock = yaml.safe_load(out.read_text())
    lock["framework"]["python"] = "[/][bold]3.0"
    out.write_text(yaml.safe_dump(lock))
    res = CliRunner().invoke(app, ["check", str(out)])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "[/][bold]3.0" in res.output, res.output


def test_a_file_system_error_names_the_file_and_exits_1(tmp_path):
    """`tileship lock --out` into a folder that does not exist printed a FileNotFoundError traceback."""
    res = CliRunner().invoke(app, ["lock", "--out", str(tmp_path / "no" / "such" / "dir" / "t.lock")])
    assert res.exit_code == 1, res.output
    assert "No such file or directory" in res.output and str(tmp_path / "no" / "such" / "dir") in res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("args", [["build", "-j", "0"], ["verify", ".", "--grid", "-1"],
                                  ["tune", ".", "--budget-ms", "-5"], ["verify", ".", "--budget-ms", "0"]])
def test_numbers_out_of_range_are_refused_naming_the_option(args):
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert args[-2] in res.output, res.output
