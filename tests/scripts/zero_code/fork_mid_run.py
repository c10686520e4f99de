"""A loop that forks mid-run (a data-preparation child, a checkpoint uploader): the child exits
through sys.exit(0), which runs the exit handlers it inherited; the parent goes on to 4 steps.
With ``kill`` as the argument the parent then kills itself (SIGKILL) instead of ending."""

import os
import signal
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
        child = os.fork()
        if child == 0:
            sys.exit(0)  # the inherited atexit handlers run here, in the child
        os.waitpid(child, 0)
        print(f"parent {os.getpid()} child {child}", flush=True)
if sys.argv[1:] == ["kill"]:
    os.kill(os.getpid(), signal.SIGKILL)
