"""A raw loop under FlopMeter fed by a DataLoader with 2 workers, in a process group of its
own, so that a SIGTERM to the group reaches the workers too (as SLURM's or Kubernetes' does):
the workers' deaths then raise the DataLoader's error from its SIGCHLD handler while the meter
writes its interrupted report. Prints ``ready`` after 6 steps; argv[1] is the output folder."""

import os
import sys
import time

os.setpgrp()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from flopmeter import FlopMeter  # noqa: E402


class Tokens(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return {"input_ids": torch.randint(1, 50, (16,))}


model = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
out = sys.argv[1]
meter = FlopMeter(
    model, pad_id=0, output=f"{out}/r.json", ledger=f"{out}/l.db", refresh_seconds=0.05
)
with meter:
    for i, batch in enumerate(DataLoader(Tokens(), batch_size=4, num_workers=2)):
        model(batch["input_ids"]).sum().backward()
        opt.step()
        opt.zero_grad()
        if i == 5:
            print("ready", flush=True)
        time.sleep(0.01)
