"""A training loop under FlopMeter that runs until it is stopped, for process-level tests.

Usage: python metered_loop.py OUTPUT MODE
MODE: "default" (SIGTERM has its default disposition), "handler" (the user installed a SIGTERM
handler that stops the loop cleanly before the meter started), "forever" (for SIGKILL),
"signal_in_write" (the process sends itself SIGTERM in the middle of a refresh's write).
Prints "step N" after each optimizer step and "handler ran" from the user's handler. The
tokens it trains on: 2 rows of 5 real tokens each per step (10 per step).
"""

from __future__ import annotations

import signal
import sys

import torch
from torch import nn

from flopmeter import FlopMeter


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 8)
        self.head = nn.Linear(8, 32)

    def forward(self, input_ids, attention_mask=None):
        return self.head(self.embed(input_ids)).sum()


def main() -> None:
    output, mode = sys.argv[1], sys.argv[2]
    stop = {"now": False}
    if mode == "handler":

        def handler(signum, frame):
            print("handler ran", flush=True)
            stop["now"] = True

        signal.signal(signal.SIGTERM, handler)
    if mode == "signal_in_write":
        import os

        from flopmeter.report import writing as report_output

        original = report_output._save

        def save_then_signal(report, *args, **kwargs):
            if report.run.status == "running" and report.tokens.optimizer_steps >= 3:
                os.kill(os.getpid(), signal.SIGTERM)  # arrives while this write holds the file
            return original(report, *args, **kwargs)

        report_output._save = save_then_signal
    torch.manual_seed(0)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ids = torch.randint(1, 32, (2, 8))
    mask = torch.tensor([[1] * 5 + [0] * 3] * 2)
    with FlopMeter(model, 0, output=output, refresh_seconds=0.05, nvml=False):
        step = 0
        while not stop["now"]:
            model(ids, attention_mask=mask).backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            print(f"step {step}", flush=True)
    print("clean exit", flush=True)


if __name__ == "__main__":
    main()
