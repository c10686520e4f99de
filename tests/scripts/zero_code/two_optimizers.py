"""Two optimizers: the first over a model (metered), a later one over a second module the loop
also trains (its compute is in no count: the report withholds the figure and says why)."""

import torch
from torch import nn

model, probe = nn.Linear(8, 8), nn.Linear(8, 1)
first = torch.optim.SGD(model.parameters(), lr=0.1)
later = torch.optim.SGD(probe.parameters(), lr=0.1)
for _ in range(2):
    probe(model(torch.ones(2, 8))).sum().backward()
    first.step()
    later.step()
    first.zero_grad()
    later.zero_grad()
print("trained")
