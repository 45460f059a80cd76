"""EXO Gym's nanoGPT example (example/nanogpt_train.py), written for exoframe.

The same experiment: a GPT trained by N nodes under ddp, fedavg, sparta, diloco or
sparta-diloco, AdamW with linear warm-up then cosine decay, gradient clipping at
`--max_norm`, `--batch_size` split into micro-batches of `--minibatch_size`, bf16 autocast, a
per-rank dataset factory `f(rank, num_nodes, train_dataset: bool)`. The text is synthetic (a
seeded Markov source whose best loss is known) instead of a downloaded corpus, and the
network is simulated: `--net wan-100mbps` reports the time the run would take there.

    python examples/exogym_nanogpt.py --strategy diloco --num_nodes 4 --max_steps 300
"""
import argparse

import torch
from torch.utils.data import TensorDataset

import exoframe
from exoframe.workloads.base import shard
from exoframe.workloads.gpt import GPT, markov_corpus

SIZES = {"tiny": dict(n_layer=2, n_head=4, n_embd=64), "small": dict(n_layer=4, n_head=4,
                                                                     n_embd=128)}
STRATEGIES = {"ddp": ("ddp", {}), "fedavg": ("fedavg", {"H": "H"}),
              "sparta": ("sparta", {"p": "p_sparta"}),
              "diloco": ("diloco", {"H": "H", "outer_lr": "outer_lr",
                                    "outer_momentum": "outer_momentum"}),
              "diloco_sparta": ("sparta-diloco", {"H": "H", "p": "p_sparta",
                                                  "outer_lr": "outer_lr"})}


def arg_parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="ddp", choices=sorted(STRATEGIES))
    parser.add_argument("--num_nodes", type=int, default=4)
    parser.add_argument("--model_size", default="tiny", choices=sorted(SIZES))
    parser.add_argument("--block_size", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--minibatch_size", type=int, default=None)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max_norm", type=float, default=1.0)
    parser.add_argument("--warmup_steps", type=int, default=100)
    parser.add_argument("--max_steps", type=int, default=1000)
    parser.add_argument("--cosine_anneal", action="store_true")
    parser.add_argument("--val_interval", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--H", type=int, default=200)
    parser.add_argument("--p_sparta", type=float, default=0.005)
    parser.add_argument("--outer_lr", type=float, default=0.7)
    parser.add_argument("--outer_momentum", type=float, default=0.9)
    parser.add_argument("--net", default="ideal", help="exoframe network preset or YAML file")
    parser.add_argument("--compute", default="measured", help="exoframe compute model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="runs")
    return parser


def dataset_factory(block_size: int, train_tokens: int = 400_000):
    """EXO Gym's factory signature: the third parameter is a bool."""
    train, val, _ = markov_corpus(32, 1, 0.1, block_size, train_tokens, 40_000, 0)

    def factory(rank: int, num_nodes: int, train_dataset: bool):
        data = TensorDataset(train if train_dataset else val)
        return shard(data, rank, num_nodes, "train" if train_dataset else "val")
    return factory


def main(argv=None):
    args = arg_parse().parse_args(argv)
    minibatch = args.minibatch_size or args.batch_size
    if args.batch_size % minibatch:
        raise SystemExit("--batch_size must be a multiple of --minibatch_size")
    torch.manual_seed(args.seed)
    model = GPT(32, args.block_size, **SIZES[args.model_size])
    strategy, mapping = STRATEGIES[args.strategy]
    trainer = exoframe.Trainer(model, dataset_factory(args.block_size), batch_size=minibatch)
    result = trainer.fit(
        strategy=strategy, num_nodes=args.num_nodes, steps=args.max_steps,
        strategy_params={ours: getattr(args, theirs) for ours, theirs in mapping.items()},
        optimizer="adamw", lr=args.lr, schedule="cosine" if args.cosine_anneal else "constant",
        warmup_steps=min(args.warmup_steps, args.max_steps - 1),
        clip_grad_norm=args.max_norm, accumulate=args.batch_size // minibatch,
        precision="bf16", eval_every=args.val_interval, seed=args.seed, net=args.net,
        compute=args.compute, device=args.device, out=args.out)
    summary = result.summary
    print(f"{args.strategy} on {args.num_nodes} nodes: final val loss "
          f"{summary['final_val_loss']:.4f}, simulated {summary['simulated_seconds']:.3g} s on "
          f"{summary['net']}, sent {summary['bytes_sent_per_node'] / 1e6:.2f} MB per node")
    return result


if __name__ == "__main__":
    main()
