"""A PyTorch training loop over a tokshuf cache: one process per rank (torchrun's RANK and
WORLD_SIZE, or one process alone), a DataLoader with worker processes, and the data position
saved in the checkpoint beside the model.

    python examples/torch_train_loop.py --cache CACHE --steps 100 --checkpoint ckpt/
    python examples/torch_train_loop.py --cache CACHE --steps 200 --checkpoint ckpt/   # resumes at 100
    torchrun --nproc-per-node 8 examples/torch_train_loop.py --cache CACHE --steps 100 --checkpoint ckpt/

Rank r of R reads every R-th example of each global batch: global batch b is the same examples
whatever R is, so a run may resume with another number of GPUs. Whatever ``--workers`` is, the
DataLoader yields exactly the plain tokshuf.Reader's batches (worker w reads batches w, w+W, ...).

The model is a toy (a bigram table over ids folded into 512 buckets) so the example runs on a
CPU in seconds: put yours in its place.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import tokshuf
import torch
import torch.distributed as dist
from tokshuf.torch import ReaderDataset

BUCKETS = 512


class Bigram(torch.nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(BUCKETS, dim)
        self.out = torch.nn.Linear(dim, BUCKETS, bias=False)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(inputs))


def save_checkpoint(folder: Path, step: int, model, opt, data_state) -> None:
    """Model, optimizer and data position together, published by one rename (rank 0 only)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "tmp.pt"
    torch.save(
        {"step": step, "model": model.state_dict(), "opt": opt.state_dict(), "data": json.dumps(data_state)}, tmp
    )
    os.replace(tmp, folder / f"step_{step:08}.pt")
    print(f"checkpoint at step {step}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=16, help="global batch size")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    ap.add_argument("--checkpoint", type=Path, help="checkpoint folder (resumes from its latest)")
    ap.add_argument("--checkpoint-every", type=int, default=10)
    args = ap.parse_args()

    if "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1

    torch.manual_seed(0)
    net = Bigram()  # saved and loaded unwrapped, so a checkpoint loads with or without DDP
    model = torch.nn.parallel.DistributedDataParallel(net) if dist.is_initialized() else net
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    reader = tokshuf.Reader(args.cache, batch_size=args.batch_size, rank=rank, world_size=world, dtype="int64")

    start = 0
    found = sorted(args.checkpoint.glob("step_*.pt")) if args.checkpoint and args.checkpoint.exists() else []
    if found:
        ckpt = torch.load(found[-1], weights_only=True)
        net.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        reader.load_state_dict(json.loads(ckpt["data"]))  # any world size: a global position
        start = ckpt["step"]

    ds = ReaderDataset(reader, steps=args.steps - start, shift=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=args.workers)
    for step, (inputs, targets) in enumerate(loader, start):
        logits = model(inputs % BUCKETS)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, BUCKETS), (targets % BUCKETS).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        done = step + 1
        if args.checkpoint and rank == 0 and (done % args.checkpoint_every == 0 or done == args.steps):
            # The main process cannot see the workers' position: count the batches taken.
            save_checkpoint(args.checkpoint, done, net, opt, ds.state_dict(batches_seen=done - start))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
