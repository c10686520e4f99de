"""FlopMeter.add_note, which the adapters use to flag a resume without saved counts."""

from __future__ import annotations

import torch

from flopmeter import FlopMeter


def test_add_note_reaches_running_and_final_reports(tmp_path):
    model = torch.nn.Embedding(10, 4)
    meter = FlopMeter(model, output=tmp_path / "r.json")
    meter.add_note("Resumed without saved counts.")
    with meter:
        model(torch.tensor([[1, 2, 3]]))
        assert "Resumed without saved counts." in meter.report().notes
    assert meter.report().notes.count("Resumed without saved counts.") == 1
    assert "Resumed without saved counts." in (tmp_path / "r.json").read_text()
