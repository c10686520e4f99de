"""The compliance rules, table-driven: threshold, margin, cross-check, parent runs, obligations,
the catalogue's lookups and the order of the original compute's sources.

Expected values come from the rules themselves (Commission guidelines C(2025) 5045, section 3.2;
AI Act Art. 51(2); Annex A.2's 30% margin), written out here by hand, and from the published
figures of ../shared/docs/pretrain-compute.md, never from flopmeter's own output.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pytest
import torch

from flopmeter import FlopMeter
from flopmeter.compliance.catalog import entries, lookup, normalise_model_id
from flopmeter.compliance.original import ENV_SOURCE, resolve_original_compute
from flopmeter.compliance.parents import parents_withheld_reason
from flopmeter.compliance.thresholds import CATALOG, determine_threshold
from flopmeter.compliance.verdict import judge
from flopmeter.errors import ConfigurationError
from flopmeter.options import MeterOptions
from flopmeter.run.facts import RunFacts
from flopmeter.run.reporting import _judgement
from flopmeter.types import Estimate, ParentRun

GPAI_DEFAULT = 1e23 / 3  # one third of 10^23 FLOP
SYSTEMIC_DEFAULT = 1e25 / 3  # one third of 10^25 FLOP
T = 1e24  # the threshold of an original trained with 3e24 FLOP


def _facts(pretrain=None, systemic=False, parents=()) -> RunFacts:
    return RunFacts(
        run_id="r",
        model_name="m",
        status="completed",
        error=None,
        started_at=None,
        ended_at=None,
        epochs=None,
        pretrain_flops=pretrain,
        pretrain_flops_source="argument" if pretrain is not None else None,
        original_systemic_risk=systemic,
        world_size=1,
        census_at_report=False,
        process_group_alive=False,
        hook_problems={},
        notes=(),
        torch_version="x",
        flopmeter_version="x",
        parent_runs=tuple(parents),
    )


def _parent(flops, status="completed", ref="parent.json") -> ParentRun:
    return ParentRun(ref=ref, run_id=f"run-{ref}", flops=flops, status=status)


@dataclass(frozen=True)
class Case:
    id: str
    own: float  # the run's primary (transformer) estimate, FLOP
    kind: str
    threshold: float
    verdict: str | None  # None: withheld
    exceeds: bool | None
    pretrain: float | None = None
    systemic: bool = False
    measured: float | None = None
    primary: str = "transformer"
    parents: tuple = ()
    cumulative: float | None = None
    basis_says: str = ""
    articles: tuple = field(default=())


CASES = [
    Case("unknown original", 1e22, "default_gpai", GPAI_DEFAULT, "below_threshold", False),
    Case("known below 1e23: the 1e23/3 fallback", 3.4e22, "default_gpai", GPAI_DEFAULT,
         "exceeds_threshold", True, pretrain=8.4e22,
         articles=("Art. 53(1)(a)", "Art. 53(1)(b)", "Art. 53(1)(c)", "Art. 53(1)(d)")),
    Case("known at exactly 1e23: one third of it", 3.0e22, "one_third_of_original", 1e23 / 3,
         "near_threshold", False, pretrain=1e23),
    Case("known above 1e23: one third of it", 1e22, "one_third_of_original", 1.7e23 / 3,
         "below_threshold", False, pretrain=1.7e23),
    Case("known above 1e25: systemic-risk original", 1.3e25, "one_third_of_original",
         3.8e25 / 3, "exceeds_threshold", True, pretrain=3.8e25,
         articles=("Art. 53(1)(a)", "Art. 53(1)(d)", "Art. 52(1)", "Art. 55(1)")),
    Case("systemic-risk fallback", 1e24, "default_systemic_risk", SYSTEMIC_DEFAULT,
         "below_threshold", False, systemic=True),
    Case("systemic risk with known compute", 1.1e24, "one_third_of_original", T,
         "exceeds_threshold", True, pretrain=3e24, systemic=True,
         articles=("Art. 53(1)(c)", "Art. 52(1)", "Art. 55(1)")),
    Case("margin: just inside 1.3x", T / 1.3 * (1 + 1e-9), "one_third_of_original", T,
         "near_threshold", False, pretrain=3e24),
    Case("margin: just outside 1.3x", T / 1.3 * (1 - 1e-9), "one_third_of_original", T,
         "below_threshold", False, pretrain=3e24),
    Case("exactly at the threshold is not exceeds", T, "one_third_of_original", T,
         "near_threshold", False, pretrain=3e24),
    Case("the next float above exceeds", math.nextafter(T, math.inf), "one_third_of_original",
         T, "exceeds_threshold", True, pretrain=3e24),
    Case("measured within the margin, primary below it", 0.5 * T, "one_third_of_original", T,
         "near_threshold", False, pretrain=3e24, measured=0.9 * T, basis_says="measured"),
    Case("measured above, primary below: near, not exceeds", 0.5 * T, "one_third_of_original",
         T, "near_threshold", False, pretrain=3e24, measured=1.2 * T,
         basis_says="is above the threshold"),
    Case("measured below too", 0.5 * T, "one_third_of_original", T, "below_threshold", False,
         pretrain=3e24, measured=0.6 * T),
    Case("measured is the primary: no cross-check of itself", 0.5 * T, "one_third_of_original",
         T, "below_threshold", False, pretrain=3e24, measured=0.5 * T, primary="measured"),
    Case("parents push it over", 0.4 * T, "one_third_of_original", T, "exceeds_threshold",
         True, pretrain=3e24, parents=(_parent(0.35 * T), _parent(0.3 * T, ref="p2")),
         cumulative=1.05 * T, basis_says="cumulative"),
    Case("parents bring it near", 0.4 * T, "one_third_of_original", T, "near_threshold",
         False, pretrain=3e24, parents=(_parent(0.4 * T),), cumulative=0.8 * T),
    Case("parent without compute withholds", 0.4 * T, "one_third_of_original", T, None, None,
         pretrain=3e24, parents=(_parent(None),)),
    Case("failed parent withholds", 0.4 * T, "one_third_of_original", T, None, None,
         pretrain=3e24, parents=(_parent(0.1 * T, status="failed"),)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_rule_and_boundary(case: Case):
    estimates = {"transformer": Estimate(flops=case.own, method="transformer", formula="")}
    if case.measured is not None:
        estimates["measured"] = Estimate(flops=case.measured, method="measured", formula="")
    facts = _facts(case.pretrain, case.systemic, case.parents)
    threshold, verdict, lineage = _judgement(facts, case.own, estimates, case.primary)
    assert threshold.kind == case.kind
    assert threshold.threshold_flops == pytest.approx(case.threshold, rel=1e-12)
    assert verdict.outcome == case.verdict
    assert verdict.exceeds_threshold == case.exceeds
    judged = case.own if case.cumulative is None else case.cumulative
    if case.verdict is None:
        assert verdict.ratio_to_threshold is None
        assert lineage.cumulative_flops is None  # never a sum that counts a parent as 0
        assert parents_withheld_reason(case.parents) is not None
        return
    assert verdict.ratio_to_threshold == pytest.approx(judged / case.threshold, rel=1e-9)
    if case.cumulative is not None:
        assert lineage.cumulative_flops == pytest.approx(case.cumulative, rel=1e-12)
    assert verdict.basis is not None and case.basis_says in verdict.basis
    articles = [o.article for o in verdict.obligations]
    if case.exceeds:
        for article in case.articles:
            assert any(article in a for a in articles), (article, articles)
    else:
        assert articles == []  # obligations only on exceeds
    if case.exceeds and not (case.systemic or (case.pretrain or 0) > 1e25):
        assert not any("52(1)" in a or "55" in a for a in articles)


def test_the_measured_above_case_names_why_and_keeps_exceeds_on_the_primary():
    j = judge(0.5 * T, T, measured_flops=1.2 * T)
    assert (j.verdict, j.exceeds) == ("near_threshold", False)
    assert "exceeds_threshold is judged on the primary figure" in j.basis


def test_the_threshold_function_agrees_with_the_table():
    assert determine_threshold(1e23).kind == "one_third_of_original"
    assert determine_threshold(math.nextafter(1e23, 0)).kind == "default_gpai"


# --- the catalogue ----------------------------------------------------------------------------

LOOKUPS = [
    ("meta-llama/Llama-3.2-3B-Instruct", "Llama 3.2 3B"),
    ("META-LLAMA/LLAMA-3.2-3B-INSTRUCT", "Llama 3.2 3B"),
    ("Llama-3.2-3B", "Llama 3.2 3B"),
    ("/home/me/models/Llama-3.2-3B-Instruct/", "Llama 3.2 3B"),
    ("unsloth/Llama-3.2-1B-Instruct-bnb-4bit", "Llama 3.2 1B"),
    ("meta-llama/Llama-2-7b-chat-hf", "Llama 2 7B"),
    ("meta-llama/Meta-Llama-3-8B-Instruct", "Llama 3 8B"),
    ("meta-llama/Meta-Llama-3.1-405B-Instruct-FP8", "Llama 3.1 405B"),
    ("meta-llama/Llama-3.3-70B-Instruct", "Llama 3.3 70B"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5 7B"),
    ("Qwen/Qwen3-8B-Base", "Qwen3 8B"),
    ("google/gemma-2-9b-it", "Gemma 2 9B"),
    ("google/gemma-3-1b-pt", "Gemma 3 1B"),
    ("microsoft/Phi-3-mini-4k-instruct", "Phi-3-mini"),
    ("microsoft/phi-4", "Phi-4"),
    ("allenai/OLMo-2-1124-7B-Instruct", "OLMo 2 7B"),
    ("tiiuae/falcon-40b-instruct", "Falcon 40B"),
    ("deepseek-ai/DeepSeek-V3-Base", "DeepSeek-V3"),
    ("HuggingFaceTB/SmolLM2-360M-Instruct", "SmolLM2 360M"),
    ("mistralai/Mistral-7B-Instruct-v0.2", "Mistral 7B"),
    ("mistralai/Mixtral-8x7B-v0.1", "Mixtral 8x7B"),
    # unknown: no guess across sizes, families or derived models
    ("gpt2", None),
    ("meta-llama/Llama-3.2-5B", None),
    ("Qwen/Qwen2.5-Coder-7B-Instruct", None),
    ("mistralai/Mistral-Nemo-Base-2407", None),
    ("llama-3.2", None),
    ("my-org/my-finetune", None),
    ("", None),
    (None, None),
]


@pytest.mark.parametrize(("model_id", "name"), LOOKUPS)
def test_catalogue_lookup(model_id, name):
    entry = lookup(model_id)
    assert (entry.name if entry else None) == name


# Figures of ../shared/docs/pretrain-compute.md, with their basis.
PUBLISHED = [
    ("Llama 2 7B", 8.4e22, "6nd"),
    ("Llama 2 70B", 8.1e23, "independent_estimate"),
    ("Llama 3.1 405B", 3.8e25, "stated"),
    ("Llama 3.2 1B", 6.6e22, "6nd"),
    ("Llama 3.2 3B", 1.7e23, "6nd"),
    ("Qwen2.5 72B", 7.8e24, "6nd"),
    ("Qwen3 235B-A22B", 4.8e24, "6nd"),
    ("Gemma 3 27B", 2.3e24, "6nd"),
    ("Phi-4", 9.3e23, "independent_estimate"),
    ("OLMo 2 32B", 1.3e24, "stated"),
    ("DeepSeek-V3", 3.3e24, "independent_estimate"),
    ("Falcon 180B", 3.8e24, "stated"),
    ("Mistral 7B", None, "not_disclosed"),
    ("Mixtral 8x7B", None, "not_disclosed"),
]


@pytest.mark.parametrize(("name", "flops", "basis"), PUBLISHED)
def test_catalogue_figures_are_the_published_ones(name, flops, basis):
    entry = next(e for e in entries() if e.name == name)
    assert (entry.flops, entry.basis) == (flops, basis)


def test_every_entry_carries_its_basis_source_and_date_and_6nd_adds_up():
    from flopmeter.compliance.catalog import compiled

    names = set()
    for e in entries():
        assert e.name not in names
        names.add(e.name)
        # the source's own date where the sources give one, never the day it was typed in
        assert e.source and (e.source_date is None or e.source_date[:4].isdigit())
        assert e.source_date != compiled()
        assert (e.flops is None) == (e.basis == "not_disclosed")
        if e.basis == "6nd":  # the figure is 6 x N x D of the parameters and tokens it names
            assert e.params and e.tokens
            assert e.flops == pytest.approx(6 * e.params * e.tokens, rel=0.05)
        else:
            assert e.params is None and e.tokens is None
    families = ("Llama 2", "Llama 3 ", "Llama 3.1", "Llama 3.2", "Llama 3.3", "Qwen2.5", "Qwen3")
    families += ("Gemma 2", "Gemma 3", "Phi-3", "Phi-3.5", "Phi-4", "OLMo 2", "Falcon")
    families += ("DeepSeek-V3", "SmolLM ", "SmolLM2", "Mistral", "Mixtral")
    for family in families:
        assert any(n.startswith(family) for n in names), family


def test_normalised_ids_strip_only_variant_suffixes():
    assert normalise_model_id("unsloth/Phi-3-mini-4k-instruct-bnb-4bit") == "phi-3-mini"
    assert normalise_model_id("Qwen/Qwen2.5-Coder-7B-Instruct") == "qwen2.5-coder-7b"


# --- where the original compute comes from ----------------------------------------------------

ID = "meta-llama/Llama-3.2-3B-Instruct"  # Llama 3.2 3B: 1.7e23 FLOP (6ND)

ORDER = [
    # (argument, environment, model id) -> (flops, source)
    ((2e24, None, ID), (2e24, "argument")),
    ((2e24, CATALOG, ID), (2e24, "argument")),
    ((CATALOG, 2e24, ID), (1.7e23, "catalog")),  # the argument is set: it decides
    ((None, 2e24, ID), (2e24, ENV_SOURCE)),
    ((None, CATALOG, ID), (1.7e23, "catalog")),
    ((None, None, ID), (None, None)),  # known to the catalogue, but not opted in
    ((CATALOG, None, "mistralai/Mistral-7B-v0.1"), (None, None)),  # not disclosed
    ((CATALOG, None, "gpt2"), (None, None)),  # unknown model
    ((CATALOG, None, None), (None, None)),  # no model id
]


@pytest.mark.parametrize(("given", "expected"), ORDER)
def test_the_order_of_the_sources(given, expected):
    original = resolve_original_compute(*given)
    assert (original.flops, original.source) == expected
    model_id = given[2]
    known = lookup(model_id)
    assert (original.catalog is not None) == (known is not None)  # shown whether chosen or not
    if known is not None and known.flops is not None:
        assert original.catalog.threshold_flops == pytest.approx(known.flops / 3)
    if original.source != "catalog" and known is not None:
        assert any("catalogue" in n for n in original.notes)
    if given[0] == CATALOG and original.flops is None:
        why = {"mistralai/Mistral-7B-v0.1": "not disclosed", "gpt2": "does not know", None: "no id"}
        assert why[model_id] in original.notes[0]
        assert "fallback threshold" in original.notes[0]


def test_options_read_catalog_from_the_argument_or_the_environment():
    opts = MeterOptions(environ={}, pretrain_flops="Catalog", model_id=ID)
    assert opts.original_compute(ID).source == "catalog"
    assert opts.given_values()["pretrain_flops"] == CATALOG  # given again as given
    env = MeterOptions(environ={"PRETRAIN_FLOPS": "catalog"})
    assert env.original_compute(ID).flops == 1.7e23
    assert "pretrain_flops" not in env.given_values()  # the environment's, not given
    number = MeterOptions(environ={"PRETRAIN_FLOPS": "catalog"}, pretrain_flops=5e24)
    assert (number.original_compute(ID).flops, number.pretrain_flops_source) == (5e24, "argument")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"pretrain_flops": "catalogue"}, "pretrain_flops"),
        ({"pretrain_flops": "lots"}, "'catalog'"),
        ({"model_id": ""}, "model_id"),
        ({"model_id": 7}, "model_id"),
        ({"parent_runs": "runs/a.json"}, "parent_runs must be a list"),
        ({"parent_runs": [3]}, "parent_runs"),
    ],
)
def test_bad_compliance_options_are_configuration_errors(options, says):
    with pytest.raises(ConfigurationError, match=says):
        MeterOptions(environ={}, **options)


def test_a_parent_run_that_cannot_be_found_fails_when_the_meter_is_made():
    """The options do no I/O: the parents are read (and a missing one refused) by the meter."""
    options = MeterOptions(environ={}, parent_runs=["no-such-run-id"])
    with pytest.raises(ConfigurationError, match="no-such-run-id"):
        FlopMeter(torch.nn.Linear(2, 2), options=options)


def test_a_bad_environment_variable_names_it():
    with pytest.raises(ConfigurationError, match="PRETRAIN_FLOPS"):
        MeterOptions(environ={"PRETRAIN_FLOPS": "catalogue"})


# --- the strict reader judges a report as the meter does ----------------------------------------


def test_a_schema_1_1_report_without_the_1_2_fields_is_still_read(tmp_path):
    from flopmeter.report.reading import FIELDS_ADDED_IN_1_2, read_report
    from tests.support.reports import V1_REPORTS, write_data

    data = json.loads((V1_REPORTS / "plain.json").read_text())  # written by flopmeter 1.2
    data["schema_version"] = "1.1"
    for name in FIELDS_ADDED_IN_1_2:
        del data[name]
    assert read_report(write_data(tmp_path, data)).verdict.outcome == data["verdict"]


def test_the_reader_applies_the_measured_cross_check_and_the_parents_sum(tmp_path):
    from flopmeter.errors import ReportFileError
    from flopmeter.report.reading import read_report
    from tests.support.reports import valid_data, write_data

    # primary 1.5e22 is 45% of 1e23/3 (below with the margin); measured 3.0e22 is 90% (near)
    data = valid_data(
        compute={"primary_flops": 1.5e22}, verdict={"ratio_to_threshold": 1.5e22 / (1e23 / 3)}
    )
    data["compute"]["estimates"]["six_nd"]["flops"] = 1.5e22
    data["compute"]["estimates"]["measured"] = {
        "flops": 3.0e22, "method": "measured", "formula": "", "inputs": {}, "notes": [],
    }  # fmt: skip
    data["verdict"]["outcome"] = "below_threshold"
    with pytest.raises(ReportFileError, match="'near_threshold'"):
        read_report(write_data(tmp_path, data))
    data["verdict"]["outcome"] = "near_threshold"
    read_report(write_data(tmp_path, data))
    # a parent of 2e22: the cumulative 3.5e22 is above 1e23/3
    data["lineage"]["parent_runs"] = [
        {"ref": "p.json", "run_id": "p", "flops": 2e22, "status": "completed"}
    ]
    data["lineage"]["cumulative_flops"] = 3.5e22
    data["verdict"].update(ratio_to_threshold=3.5e22 / (1e23 / 3), judged_flops=3.5e22)
    data["verdict"].update(exceeds_threshold=True, outcome="exceeds_threshold")
    read_report(write_data(tmp_path, data))
    data["lineage"]["cumulative_flops"] = 3.4e22
    data["verdict"]["judged_flops"] = 3.4e22
    with pytest.raises(ReportFileError, match="cumulative_flops"):
        read_report(write_data(tmp_path, data))


def test_parent_flops_counts_each_earlier_run_once():
    from flopmeter.compliance.parents import parent_flops, parent_notes

    a = ParentRun(ref="a.json", run_id="A", flops=1.0, own_flops=1.0, status="completed")
    b = ParentRun(ref="b.json", run_id="B", flops=11.0, own_flops=10.0, status="completed",
                  ancestor_flops={"A": 1.0})  # fmt: skip
    c = ParentRun(ref="c.json", run_id="C", flops=101.0, own_flops=100.0, status="completed",
                  ancestor_flops={"A": 1.0})  # fmt: skip
    assert parent_flops([b, a]) == 11.0  # A named, and inside B: once
    assert parent_flops([a, b]) == 11.0  # in either order
    assert parent_flops([b, c]) == 111.0  # A shared by B and C: once
    notes = parent_notes([b, a], 1.0, None)
    assert any("a.json (run A)" in n and "b.json" in n and "counted once" in n for n in notes)
    # a parent recorded before own_flops existed counts as one block, as it was
    legacy = ParentRun(ref="old.json", run_id="O", flops=5.0, status="completed")
    assert parent_flops([legacy, a]) == 6.0


def test_catalogue_dates_are_the_sources_own():
    from flopmeter.compliance.catalog import compiled, lookup
    from flopmeter.compliance.original import catalog_figure

    # ../shared/docs/pretrain-compute.md: DeepSeek-V3 from Epoch AI's May 2026 snapshot; the
    # Llama 3 paper (2024) for Llama 3.1 405B; no date given for the Llama 3.2 model card
    assert lookup("deepseek-ai/DeepSeek-V3").source_date == "2026-05"
    assert lookup("meta-llama/Llama-3.1-405B").source_date == "2024"
    assert lookup("meta-llama/Llama-3.2-3B").source_date is None
    assert compiled() == "2026-12-01"
    figure = catalog_figure("meta-llama/Llama-3.2-3B-Instruct")
    assert figure.date is None and figure.catalog_compiled == "2026-12-01"


def test_a_parent_judged_against_another_threshold_is_named_in_human_figures():
    from flopmeter.compliance.parents import parent_notes

    other = ParentRun(ref="old.json", run_id="O", flops=1e22, own_flops=1e22,
                      status="completed", threshold_flops=1e24 / 3)  # fmt: skip
    (note,) = parent_notes([other], 1e23 / 3, None)
    # 1e24 / 3 = 3.3e23 and 1e23 / 3 = 3.3e22, two significant figures
    assert "old.json (3.3 × 10^23 FLOP)" in note and "(3.3 × 10^22 FLOP)" in note
    assert "e+" not in note
