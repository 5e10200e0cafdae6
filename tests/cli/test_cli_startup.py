"""A command imports its own subcommand's module alone (spec/cli/__init__.py command_modules):
``minibert check`` does not pay for importing bench, train or audit before it starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minibert_spec.cli import build_parser, command_modules

EVERY = command_modules(None)


def test_every_subcommand_has_a_module_and_none_is_lost():
    assert {"check", "bench", "train", "fill_mask", "audit", "mutate"} <= set(EVERY)
    assert command_modules([]) == EVERY
    assert command_modules(["--help"]) == EVERY
    assert command_modules(["--debug"]) == EVERY
    assert command_modules(["chek", "x"]) == EVERY  # a typo: argparse lists every choice


@pytest.mark.parametrize("argv, module", [(["check", "mybert", "-x"], "check"),
                                          (["--debug", "fill-mask", "a [MASK]"], "fill_mask"),
                                          (["report", "merge", "a.json"], "report")])
def test_a_command_line_registers_the_command_it_names(argv, module):
    assert command_modules(argv) == [module]
    parser = build_parser(argv)
    choices = next(a.choices for a in parser._actions if a.dest == "command")
    assert list(choices) == [module.replace("_", "-")]


def test_minibert_check_does_not_import_the_other_commands():
    code = ("import sys; from minibert_spec.cli import build_parser; "
            "build_parser(['check', 'mybert']).parse_args(['check', 'mybert']); "
            "print(sorted(m for m in sys.modules if m.startswith('minibert_spec.cli.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    loaded = eval(out)  # a list of module names
    assert "minibert_spec.cli.check" in loaded
    assert not {f"minibert_spec.cli.{m}" for m in ("bench", "train", "audit", "mutate")} \
        & set(loaded)


def test_a_typo_still_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        build_parser(["chek"]).parse_args(["chek"])
    err = capsys.readouterr().err
    assert "invalid choice: 'chek'" in err and "bench" in err and "fill-mask" in err
