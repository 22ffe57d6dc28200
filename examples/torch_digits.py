"""Trains an MLP on the handwritten digits that scikit-learn ships (1797
8x8 images, no download) with strata as the optimizer, and prints the loss
and the held-out accuracy.

    PYTHONPATH=build/python python3 -m strata.launch --workers 2 \\
        examples/torch_digits.py --steps 300 --dtype bf16

Each step takes a global batch of --batch training samples; each worker
computes the mean loss of its equal share and strata averages the workers'
gradients, so the step is the one a single process would take on the whole
batch. Rank 0 prints the loss (the mean over the batch) every --log-every
steps, the held-out accuracy at the end, and with --out writes a JSON
summary. The functions here are also the tests' reference training loop
(tests/python).
"""

import argparse
import json
import math
import sys
import time

import numpy as np
import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HELD_OUT = 360


def load_data(seed=0):
    """(x_train, y_train, x_test, y_test): the digits scaled to [0, 1], the
    last HELD_OUT of a fixed shuffle held out."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x = torch.tensor(x[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[order], dtype=torch.long)
    return x[:-HELD_OUT], y[:-HELD_OUT], x[-HELD_OUT:], y[-HELD_OUT:]


def make_model(seed=0, hidden=128):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def batch_indices(step, batch, num_samples):
    """The global batch of step `step` (1-based): consecutive samples of the
    training set, wrapping around."""
    start = ((step - 1) * batch) % num_samples
    return torch.arange(start, start + batch) % num_samples


def make_param_groups(model, lr, weight_decay):
    """The usual recipe: weights decay, biases do not (and learn at half the
    rate, to exercise a second learning rate)."""
    weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    return [dict(params=weights, weight_decay=weight_decay),
            dict(params=biases, weight_decay=0.0, lr=lr / 2)]


def make_schedule(optimizer, kind, steps):
    """None, or a torch LambdaLR: "warmup-cosine" rises linearly from 0 over
    the first tenth of the steps, then decays along a cosine to 0."""
    if kind == "none":
        return None
    if kind != "warmup-cosine":
        raise ValueError("unknown schedule %r" % kind)
    warmup = max(1, steps // 10)

    def factor(step):
        if step < warmup:
            return step / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=128, help="global batch (samples per step)")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--schedule", choices=["none", "warmup-cosine"], default="none")
    parser.add_argument("--chunk-params", type=int, default=4096)
    parser.add_argument("--params", choices=["replicated", "on_demand"], default="replicated",
                        help="on_demand: each worker keeps 1/W of the model and gathers each "
                             "layer around its use (ZeRO-3 style)")
    parser.add_argument("--param-groups", action="store_true",
                        help="two parameter groups: weights with decay, biases without "
                             "and at half the learning rate")
    parser.add_argument("--stream", action="store_true",
                        help="stream the step: gradients leave during backward")
    parser.add_argument("--bucket-params", type=int, default=1 << 20,
                        help="parameters per bucket of the streamed step")
    parser.add_argument("--state-precision", choices=["fp32", "int8"], default="fp32",
                        help="how the shard servers store Adam's moments")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--out", default="", help="rank 0 writes a JSON summary here")
    parser.add_argument("--save-weights", default="",
                        help="rank 0 writes the final FP32 master weights here (torch.save)")
    return parser.parse_args(argv)


def main(argv=None):
    import strata.torch  # here, so that the tests can import this file without strata

    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = load_data()
    model = make_model()
    opt = strata.torch.ShardedOptimizer(model, lr=args.lr, weight_decay=args.weight_decay,
                                        dtype=DTYPES[args.dtype],
                                        chunk_params=args.chunk_params, params=args.params,
                                        stream=args.stream, bucket_params=args.bucket_params,
                                        state_precision=args.state_precision,
                                        param_groups=(make_param_groups(
                                            model, args.lr, args.weight_decay)
                                            if args.param_groups else None))
    schedule = make_schedule(opt, args.schedule, args.steps)
    if args.batch % opt.world_size != 0:
        raise SystemExit("--batch %d is not a multiple of the %d workers"
                         % (args.batch, opt.world_size))
    share = args.batch // opt.world_size
    losses = []
    started = time.monotonic()
    while opt.step_count < args.steps:
        step = opt.step_count + 1
        mine = batch_indices(step, args.batch, len(x_train))[opt.rank * share:][:share]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x_train[mine]), y_train[mine])
        opt.backward(loss)
        opt.step()
        if schedule is not None:
            schedule.step()
        batch_loss = opt.all_reduce_sum([loss.item()])[0] / opt.world_size
        losses.append(batch_loss)
        if opt.rank == 0 and (step % args.log_every == 0 or step == 1):
            print("step %4d  loss %.4f  lr %.2e  loss scale %g"
                  % (step, batch_loss, opt.param_groups[0]["lr"], opt.loss_scale), flush=True)
    held_out = accuracy(model, x_test, y_test)
    if opt.rank == 0:
        seconds = time.monotonic() - started
        memory = opt.param_memory()
        print("held-out accuracy %.2f%% after %d steps (%s, %s parameters, %d workers, %.1f s)"
              % (100 * held_out, args.steps, args.dtype, args.params, opt.world_size, seconds),
              flush=True)
        print("parameter memory: " + ", ".join("%s %d" % kv for kv in sorted(memory.items())))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(dict(dtype=args.dtype, steps=args.steps, workers=opt.world_size,
                               losses=losses, held_out_accuracy=held_out, seconds=seconds,
                               param_memory=memory,
                               streamed_micro_batches=opt.streamed_micro_batches), f)
        if args.save_weights:
            torch.save({name: state[0] for name, state in opt.master_state().items()},
                       args.save_weights)
    return 0


if __name__ == "__main__":
    sys.exit(main())
