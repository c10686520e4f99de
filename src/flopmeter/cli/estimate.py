"""``flopmeter estimate``: plan a run's compute and verdict before training.

The planner is imported inside :func:`run`, so the command line starts without it; a plan of
bare numbers (``--params``) imports neither torch nor transformers (a fraction of a second), a
plan of a model imports them, with peft, to build it on meta, unless the on-disk plan cache
holds the plan of the same inputs (:mod:`flopmeter.planner.plan_cache`; ``--no-cache`` plans
afresh). Exit status 3 when ``--fail-on`` is given and a planned method reaches that verdict
(``near`` includes ``exceeds``); 2 for bad input, as every command.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from flopmeter.cli._args import add_threshold_args
from flopmeter.errors import ConfigurationError

if TYPE_CHECKING:
    from flopmeter.planner import Plan

#: The exit status when a planned method reaches the ``--fail-on`` verdict.
FAIL_ON_STATUS = 3
_FAIL_ON = {
    "exceeds": ("exceeds_threshold",),
    "near": ("near_threshold", "exceeds_threshold"),
}
_METHODS = ("full", "lora", "qlora", "spectrum", "freeze")


def _count(text: str) -> int:
    """A count as people write it (``1e9``, ``500M``); argparse names the option in errors."""
    from flopmeter.planner.numbers import parse_count

    try:
        return parse_count(text, "the count")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _in_unit(text: str, *, zero: bool) -> float:
    """A number in (0, 1], or with ``zero`` in [0, 1]; argparse names the option in errors."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (0 <= value <= 1 if zero else 0 < value <= 1):
        raise argparse.ArgumentTypeError(f"must be in {'[' if zero else '('}0, 1]: {text!r}")
    return value


def _fraction(text: str) -> float:
    return _in_unit(text, zero=False)


def _share(text: str) -> float:
    return _in_unit(text, zero=True)


def _epochs(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0 (0.5, 1, 3): {text!r}")
    return int(value) if value.is_integer() else value


def _targets(text: str) -> str | tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("no module names")
    return "all-linear" if names == ("all-linear",) else names


def _legacy(plan: Plan) -> None:
    """Bare numbers: the lines the command printed before the planner (kept for scripts)."""
    from flopmeter.report import format_flops

    m = plan.methods[0]
    print(
        f"planned run: {m.n_total:,} parameters ({m.n_trainable:,} trainable), {m.tokens:,} tokens"
    )
    print(f"  seed (4N + 2N_trainable) x D   {format_flops(m.seed_flops)}")
    print(f"  6ND                            {format_flops(m.six_nd_flops)}")
    kind = f"{m.threshold_kind}{plan.threshold_note}"
    print(f"  threshold                      {format_flops(m.threshold_value)} ({kind})")
    print(f"  verdict (larger estimate)      {m.verdict}")
    if m.tokens_to_threshold is not None:
        print(f"  tokens to reach the threshold  {m.tokens_to_threshold:.2e}")


def run(args: argparse.Namespace) -> int:
    """Prints the plan; returns :data:`FAIL_ON_STATUS` when ``--fail-on`` is met, else 0."""
    from flopmeter.planner import estimate
    from flopmeter.planner.render import render

    if args.list:
        from flopmeter.planner.models import bundled_model_ids

        print("\n".join(bundled_model_ids()))
        return 0
    if args.model is None and (args.dataset is not None or args.method):
        raise ConfigurationError("--dataset and --method need a MODEL (config.json, folder or id)")
    if args.model is None and args.recipe != "sft":
        raise ConfigurationError(
            f"--recipe {args.recipe} needs a MODEL (config.json, folder or id)"
        )
    plan = estimate(
        model=args.model,
        tokens=args.tokens,
        dataset=args.dataset,
        tokenizer=args.tokenizer,
        epochs=args.epochs,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        methods=tuple(args.method) if args.method else None,  # None: all the model allows
        lora_r=args.lora_r,
        lora_targets=args.lora_targets,
        spectrum_fraction=args.spectrum_fraction,
        freeze_layers=args.freeze_layers,
        params=args.params,
        trainable=args.trainable,
        decoder_tokens=args.decoder_tokens,
        images=args.images,
        clips=args.clips,
        pretrain_flops=args.pretrain_flops,  # "catalog" is looked up for MODEL
        systemic_risk=args.systemic_risk,
        cache=not args.no_cache,  # a plan of a model only: bare numbers are arithmetic
        **_recipe_inputs(args),
    )
    if args.model is None and args.format == "table" and args.recipe == "sft":
        _legacy(plan)
    else:
        print(render(plan, args.format))
    reached = [m.method for m in plan.methods if m.verdict in _FAIL_ON.get(args.fail_on or "", ())]
    return FAIL_ON_STATUS if reached else 0


def _recipe_inputs(args: argparse.Namespace) -> dict[str, object]:
    """The recipe's options as :class:`~flopmeter.planner.plan.PlanRequest` fields."""
    return {
        "recipe": args.recipe,
        "prompts": args.prompts,
        "prompt_len": args.prompt_len,
        "completion_len": args.completion_len,
        "rejected_len": args.rejected_len,
        "generations": args.generations,
        "iterations": args.iterations,
        "reference": args.reference,
        "old_logps": args.old_logps,
        "reward_models": tuple(args.reward_model or ()),
        "reward_len": args.reward_len,
        "teacher": args.teacher,
        "on_policy": args.on_policy,
        "phases": args.phases,
    }


def _add_recipe_args(p: argparse.ArgumentParser) -> None:
    """A post-training recipe and its shape (docs/planner.md, "Post-training recipes")."""
    from flopmeter.planner.recipe_shape import RECIPES

    g = p.add_argument_group(
        "post-training recipes",
        "a recipe's run by phase, as the meter reports it (training, generation, scoring, "
        "other models); its tokens come from these options, not --tokens",
    )
    g.add_argument(
        "--recipe", choices=RECIPES, default="sft", help="sft (default): training passes only"
    )
    g.add_argument("--prompts", type=_count, help="prompts of the run (dpo: preference pairs)")
    g.add_argument("--prompt-len", type=_count, help="tokens per prompt")
    g.add_argument(
        "--completion-len",
        type=_count,
        help="tokens per completion, planned at full length (dpo: the chosen one)",
    )
    g.add_argument("--rejected-len", type=_count, help="dpo: tokens of the rejected completion")
    _add_grpo_args(g)
    g.add_argument(
        "--teacher", metavar="MODEL", help="distill: the teacher (config.json, folder, id)"
    )
    g.add_argument(
        "--on-policy",
        type=_share,
        help="distill: share of completions the student generates (default 1, TRL's "
        "DistillationTrainer; GKD: its lmbda; 0: offline)",
    )
    g.add_argument(
        "--phases",
        metavar="POLICY",
        help="which phases are judged: modification (default: every phase that fed the run) "
        "or updates (the training passes only)",
    )


def _add_grpo_args(g: argparse._ArgumentGroup) -> None:
    """GRPO's own options: generations, iterations, the reference, the old log-probs, reward
    models."""
    g.add_argument(
        "--generations", type=_count, help="grpo: completions per prompt (default 8, TRL's)"
    )
    g.add_argument(
        "--iterations", type=_count, help="grpo: training passes per generation (default 1)"
    )
    g.add_argument(
        "--reference",
        action="store_true",
        default=False,
        help="grpo: a KL reference (TRL's beta > 0); dpo always has one",
    )
    g.add_argument(
        "--old-logps",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="grpo: the old log-probs are recomputed (default: with --iterations above 1)",
    )
    g.add_argument(
        "--reward-model",
        action="append",
        metavar="MODEL",
        help="grpo: a reward model's config.json, folder or id (repeatable)",
    )
    g.add_argument(
        "--reward-len",
        type=_count,
        help="grpo: tokens of a prompt + completion as the reward models' tokenizer reads them",
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``estimate`` subcommand."""
    p = sub.add_parser(
        "estimate",
        help="plan a run: compute and verdict before training, method by method",
        description="Plan a fine-tuning run's compute and verdict (docs/planner.md). Exit "
        f"status {FAIL_ON_STATUS} when --fail-on is met, 2 on bad input.",
    )
    p.add_argument(
        "model",
        nargs="?",
        help="a config.json, a model folder, or a bundled model id (meta-llama/Llama-3.2-3B)",
    )
    _add_token_args(p)
    _add_method_args(p)
    _add_recipe_args(p)
    p.add_argument(
        "--list", action="store_true", help="list every bundled model id, one per line, and stop"
    )
    p.add_argument("--params", type=_count, help="parameters, for a model without a config")
    p.add_argument("--trainable", type=_count, help="trainable parameters (with --params)")
    add_threshold_args(p)
    p.add_argument(
        "--format",
        choices=("table", "json", "md"),
        default="table",
        help="json: the whole plan (docs/planner.md)",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="make the plan afresh: neither read nor write the on-disk plan cache "
        "(docs/planner.md, Speed)",
    )
    p.add_argument(
        "--fail-on",
        choices=tuple(_FAIL_ON),
        help=f"exit {FAIL_ON_STATUS} when a method reaches this verdict",
    )
    p.set_defaults(func=run)


def _add_token_args(p: argparse.ArgumentParser) -> None:
    """What the run trains on: tokens or a dataset, and each family's own budget."""
    p.add_argument(
        "--tokens",
        type=_count,
        help="training tokens (1e9, 500M): text tokens; an encoder-decoder's encoder tokens; "
        "a speech model's transcript tokens",
    )
    p.add_argument(
        "--decoder-tokens",
        type=_count,
        help="encoder-decoders (T5, BART): target (decoder) tokens of all sequences",
    )
    p.add_argument(
        "--images",
        type=_count,
        help="vision-language models (LLaVA): images of all sequences (0: text only)",
    )
    p.add_argument("--clips", type=_count, help="speech models (Whisper): audio clips of 30 s each")
    p.add_argument(
        "--dataset", help="a JSONL file of examples (text, messages or prompt+completion)"
    )
    p.add_argument("--tokenizer", help="a local tokenizer folder for --dataset")
    p.add_argument(
        "--epochs",
        type=_epochs,
        default=1,
        help="passes over --dataset, above 0 (1.5: one pass and half of another); "
        "with --tokens give the total instead",
    )
    p.add_argument("--seq-len", type=_count, help="sequence length (default 2048)")
    p.add_argument(
        "--batch-size",
        type=_count,
        default=1,
        help="sequences per micro-batch (default 1; matters only for LoRA on expert weights)",
    )


def _add_method_args(p: argparse.ArgumentParser) -> None:
    """The methods to plan and their settings."""
    p.add_argument(
        "--method", action="append", choices=_METHODS, help="plan this method only (repeatable)"
    )
    p.add_argument("--lora-r", type=_count, default=16, help="LoRA rank (default 16)")
    p.add_argument(
        "--lora-targets",
        type=_targets,
        default="all-linear",
        help="all-linear or q_proj,v_proj,...",
    )
    p.add_argument(
        "--spectrum-fraction",
        type=_fraction,
        default=0.25,
        help="share of blocks trained (default 0.25)",
    )
    p.add_argument(
        "--freeze-layers",
        type=_count,
        help="blocks frozen by freeze (default half)",
    )
