"""A throwaway first optimizer over a bare tensor (a warm-up LBFGS, built and, with ``step``,
stepped), then the real model's optimizer: zero-code metering attaches to the real model."""

import sys

import torch
from torch import nn

scale = torch.ones(1, requires_grad=True)
lbfgs = torch.optim.LBFGS([scale])
if sys.argv[1:] == ["step"]:

    def closure():
        lbfgs.zero_grad()
        loss = ((scale - 2.0) ** 2).sum()
        loss.backward()
        return loss

    lbfgs.step(closure)
model = nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.ones(2, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
print("trained")
