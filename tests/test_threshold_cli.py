"""``flopmeter threshold [MODEL_ID] [--pretrain-flops X|catalog] [--systemic-risk]``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from flopmeter.cli import main


def _run(capsys, *argv: str) -> str:
    assert main(["threshold", *argv]) == 0
    return " ".join(capsys.readouterr().out.split())  # wrapping undone


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # near from 3.33e22 / 1.3 = 2.56e22, 1 / 1.3 = 76.9 % of the threshold
        ((), ["3.3 × 10^22 FLOP (default_gpai)", "not known", "above 2.6 × 10^22 FLOP, 77 % of it"]),
        (("--pretrain-flops", "3.8e25"), ["1.3 × 10^25 FLOP (one_third_of_original)"]),
        # 8.4e22 / 3 = 2.8e22 is shown, and the fallback 3.3e22 named the less strict one
        (("--pretrain-flops", "8.4e22"), ["3.3 × 10^22 FLOP (default_gpai)", "below 10^23",
                                          "One third of it would be 2.8 × 10^22 FLOP",
                                          "less strict", "flopmeter's reading, not the guidelines'"]),
        (("--systemic-risk",), ["3.3 × 10^24 FLOP (default_systemic_risk)", "Art. 51(2)"]),
        (
            ("meta-llama/Llama-3.2-3B-Instruct",),
            ["3.3 × 10^22 FLOP (default_gpai)", "Llama 3.2 3B: 1.7 × 10^23 FLOP", "Not used",
             "would give 5.7 × 10^22 FLOP"],
        ),
        (
            ("meta-llama/Llama-3.2-3B-Instruct", "--pretrain-flops", "catalog"),
            ["5.7 × 10^22 FLOP (one_third_of_original)", "the catalogue: Llama 3.2 3B, 6nd",
             "Used, as asked"],
        ),
        (
            ("mistralai/Mistral-7B-v0.1", "--pretrain-flops", "catalog"),
            ["3.3 × 10^22 FLOP (default_gpai)", "Mistral 7B: not disclosed", "fallback"],
        ),
        (("gpt2", "--pretrain-flops", "catalog"), ["no entry for 'gpt2'", "fallback"]),
        (("--pretrain-flops", "catalog"), ["no MODEL_ID was given"]),
    ],
)  # fmt: skip
def test_threshold_names_rule_value_and_why(capsys, argv, says):
    out = _run(capsys, *argv)
    for fragment in says:
        assert fragment in out, (fragment, out)


def test_the_environment_may_opt_in_to_the_catalogue(monkeypatch, capsys):
    monkeypatch.setenv("PRETRAIN_FLOPS", "catalog")
    out = _run(capsys, "Qwen/Qwen2.5-7B-Instruct")
    assert "2.7 × 10^23 FLOP (one_third_of_original)" in out  # 8.2e23 / 3
    assert _run(capsys, "Qwen/Qwen2.5-7B-Instruct", "--pretrain-flops", "3e24").startswith(
        "Threshold: 1.0 × 10^24 FLOP"  # the flag beats the variable
    )


def test_a_bad_value_names_the_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["threshold", "--pretrain-flops", "catalogue"])
    assert info.value.code == 2
    assert "--pretrain-flops" in capsys.readouterr().err


def test_the_threshold_command_imports_no_torch():
    """Runs the command's own module with torch (and numpy, transformers) made unimportable,
    without the package root (which the rendering work makes lazy)."""
    script = textwrap.dedent(
        """
        import importlib.util, sys, types
        spec = importlib.util.find_spec("flopmeter")
        root = types.ModuleType("flopmeter")
        root.__path__ = list(spec.submodule_search_locations)
        root.__spec__ = spec  # importlib.resources finds the bundled catalogue through it
        sys.modules["flopmeter"] = root

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "numpy", "transformers"):
                    raise ImportError("blocked " + name)

        sys.meta_path.insert(0, Block())
        from flopmeter.cli import _args, threshold
        parser = _args.Parser(prog="flopmeter")
        threshold.register(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["threshold", "Qwen/Qwen3-8B", "--pretrain-flops", "catalog"])
        args.func(args)
        assert not any(m.split(".")[0] == "torch" for m in sys.modules)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "6.0 × 10^23 FLOP (one_third_of_original)" in result.stdout  # 1.8e24 / 3
