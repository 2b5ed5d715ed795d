"""A JAX training loop over a tokshuf cache: one process per host, each reading its own slice of
every global batch, with the data position saved in the checkpoint beside the parameters.

    python examples/jax_train_loop.py --cache CACHE --steps 100 --checkpoint ckpt/
    python examples/jax_train_loop.py --cache CACHE --steps 200 --checkpoint ckpt/   # resumes at 100

On several hosts, run the same command on each with jax.distributed's settings (or let
jax.distributed.initialize() find them on a TPU pod or a SLURM cluster):

    python examples/jax_train_loop.py --cache CACHE --coordinator HOST0:1234 --num-processes 2 --process-id 0 ...

Process p of P reads rank p of world size P: global batch b is the same examples whatever P is,
so a run may resume on another number of hosts. ``--loader grain`` reads through Grain
(tokshuf.grain.map_dataset) and checkpoints Grain's iterator instead; the batches are the same.

The model is a toy (a bigram table over ids folded into 512 buckets) so the example runs on a
CPU in seconds: put yours in its place.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import tokshuf
from jax.sharding import Mesh, NamedSharding, PartitionSpec

BUCKETS = 512


def loss_fn(params, batch):
    ids = batch % BUCKETS
    inputs, targets = ids[:, :-1], ids[:, 1:]
    logits = params["emb"][inputs] @ params["out"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


@jax.jit
def train_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.5 * g, params, grads), loss


def init_params(dim=32):
    k1, k2 = jax.random.split(jax.random.key(0))
    return {
        "emb": 0.02 * jax.random.normal(k1, (BUCKETS, dim)),
        "out": 0.02 * jax.random.normal(k2, (dim, BUCKETS)),
    }


def save_checkpoint(folder: Path, step: int, params, data_state) -> None:
    """Parameters and the data position together, published by one rename (process 0 only)."""
    tmp = folder / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    np.savez(tmp / "params.npz", **{k: np.asarray(v) for k, v in params.items()})
    (tmp / "state.json").write_text(json.dumps({"step": step, "data": data_state}))
    os.replace(tmp, folder / f"step_{step:08}")
    print(f"checkpoint at step {step}", flush=True)


def latest_checkpoint(folder: Path):
    found = sorted(folder.glob("step_*")) if folder.exists() else []
    if not found:
        return None
    state = json.loads((found[-1] / "state.json").read_text())
    with np.load(found[-1] / "params.npz") as f:
        params = {k: jnp.asarray(f[k]) for k in f.files}
    return state, params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=16, help="global batch size")
    ap.add_argument("--checkpoint", type=Path, help="checkpoint folder (resumes from its latest)")
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--loader", choices=["reader", "grain"], default="reader")
    ap.add_argument("--coordinator", help="jax.distributed coordinator address HOST:PORT")
    ap.add_argument("--num-processes", type=int)
    ap.add_argument("--process-id", type=int)
    args = ap.parse_args()

    if args.coordinator:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    rank, world = jax.process_index(), jax.process_count()
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
    B = args.batch_size

    params, start, data_state = init_params(), 0, None
    if args.checkpoint and (found := latest_checkpoint(args.checkpoint)):
        state, params = found
        start, data_state = state["step"], state["data"]

    if args.loader == "reader":
        reader = tokshuf.Reader(args.cache, batch_size=B, rank=rank, world_size=world)
        if data_state is not None:
            reader.load_state_dict(data_state)  # any world size: the state is a global position
        batches, seqlen = reader, reader.seqlen
    else:
        from tokshuf.grain import map_dataset

        ds = map_dataset(args.cache, batch_size=B, rank=rank, world_size=world, num_records=B * args.steps)
        batches = iter(ds.to_iter_dataset())
        if data_state is not None:
            batches.set_state(data_state)  # Grain's state is per process: resume on the same world size
        seqlen = tokshuf.Cache(args.cache).seqlen

    for step in range(start, args.steps):
        local = next(batches)  # (B // world, seqlen): this process's rows of global batch `step`
        batch = jax.make_array_from_process_local_data(sharding, local, (B, seqlen))
        params, loss = train_step(params, batch)
        print(f"step {step} loss {float(loss):.6f}", flush=True)
        done = step + 1
        if args.checkpoint and rank == 0 and (done % args.checkpoint_every == 0 or done == args.steps):
            data = reader.state_dict() if args.loader == "reader" else batches.get_state()
            save_checkpoint(args.checkpoint, done, params, data)


if __name__ == "__main__":
    main()
