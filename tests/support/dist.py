"""Two CPU processes under torch.distributed (gloo): the process group of a spawned worker, and
the write log of the torchrun scripts."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (for a torchrun rendezvous the test starts next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(
    root: Path, ranks_per_node: int, args: list[str], env: dict[str, str]
) -> list[tuple[int, str]]:
    """torchrun as 2 nodes of ``ranks_per_node`` ranks on 127.0.0.1, each node its own
    ``flopmeter run`` in its own folder (``root/node0``, ``root/node1``), as on a cluster;
    ``args`` the script and its arguments. Returns each node's ``(exit status, stderr)``."""
    port = free_port()  # for the rendezvous
    nodes = []
    for node in (0, 1):
        folder = root / f"node{node}"
        folder.mkdir()
        cmd = [sys.executable, "-m", "flopmeter.cli", "run", "--", sys.executable, "-m",
               "torch.distributed.run", "--nnodes", "2", "--nproc_per_node",
               str(ranks_per_node), "--node_rank", str(node), "--master_addr", "127.0.0.1",
               "--master_port", str(port), *args]  # fmt: skip
        nodes.append(subprocess.Popen(cmd, cwd=folder, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    return [_finish(p) for p in nodes]


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


def join_gloo(rank: int, world: int, store: str) -> None:
    """Joins this process (one CPU thread) to a gloo group of ``world`` ranks that meet at the
    file ``store``."""
    import torch
    import torch.distributed as dist

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


@contextlib.contextmanager
def gloo_group(rank: int, world: int, store: str) -> Iterator[None]:
    """``join_gloo`` for the block; at its end, a barrier (no rank tears gloo down while a peer
    still talks to it) and the group destroyed, whatever ended the block."""
    import torch.distributed as dist

    join_gloo(rank, world, store)
    try:
        yield
    finally:
        dist.barrier()
        dist.destroy_process_group()


def record_writes() -> None:
    """Makes every FlopReport.write_json call append ``rank path`` to $FM_WRITES_LOG."""
    from flopmeter import distributed
    from flopmeter.report import FlopReport

    log = os.environ["FM_WRITES_LOG"]
    original = FlopReport.write_json

    def write_json(self, path):
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{distributed.rank()} {path}\n")
        return original(self, path)

    FlopReport.write_json = write_json


def dump_rank_facts(folder: str | os.PathLike[str], rank: int, **facts: Any) -> None:
    """Writes what a rank fed (its own count) to ``folder/rank{rank}.json``."""
    Path(folder, f"rank{rank}.json").write_text(json.dumps(facts), encoding="utf-8")
