"""An optimizer over a bare tensor that no module holds: zero-code metering cannot attach, and
the script must run on and exit 0."""

import torch

weight = torch.zeros(8, requires_grad=True)
optimizer = torch.optim.SGD([weight], lr=0.1)
for _ in range(3):
    loss = ((weight - 1.0) ** 2).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print("trained", float(weight.sum()))
