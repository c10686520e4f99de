"""A loop that calls sys.exit(3) after two steps: under zero-code the job exits 3 and the report
says ``failed`` with the exit code, not ``completed``."""

import sys

import torch
from torch import nn

model = nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == 1:
        sys.exit(3)
