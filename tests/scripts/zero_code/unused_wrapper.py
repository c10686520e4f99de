"""A wrapper built over the model but not called: the optimizer steps the wrapper's parameters,
so zero-code metering attaches to the wrapper, and the loop calls the inner model."""

import torch
from torch import nn


class Wrapper(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


model = nn.Linear(8, 8)
wrapped = Wrapper(model)
optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
for _ in range(3):
    model(torch.ones(2, 8)).sum().backward()  # the inner model, not the wrapper
    optimizer.step()
    optimizer.zero_grad()
print("trained")
