"""python3 -m strata.bench.gpu_peers: strata on a GPU against what GPU users run.

Trains the same model (an MLP of --layers Linear(--width, --width) layers,
1.07 B parameters by default) with the same batch on one GPU, one worker,
four ways, one after the other, each in a process of its own:

  compute  the forward and backward alone (FP32 weights, BF16 autocast), no
           optimizer: the bound every step is measured against
  strata   strata.torch.ShardedOptimizer with the client's buffers on the GPU
           (NCCL in place), --dtype gradients and parameters, a local cluster
           of --servers shard servers that hold the FP32 weights and AdamW
           states in host memory (no GPU tier): no optimizer state on the GPU;
           --param-sync per_module writes each layer's new weights just
           before its forward rather than all in the step
  fsdp2    torch's fully_shard (FSDP2) per layer with CPUOffloadPolicy (the
           weights, gradients and AdamW states in host memory, AdamW on the
           CPU) and BF16 compute (MixedPrecisionPolicy)
  plain    torch.optim.AdamW(fused=True) with every state on the GPU

A step is the median over --steps steps after --warmup; each system's GPU
memory is what the process holds on the GPU at its peak (CUDA's used memory
less what it held before making the model). Prints one line per system
and, last, one JSON object: model_params, each system's step_s and
gpu_bytes, forward_backward_s, strata_over_plain (the target: <= 1.2),
strata_over_fsdp2 (< 1), strata_overhead_over_compute (strata's step over
its own forward+backward, minus 1) and where strata's step goes.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from strata.bench.peers import file_rendezvous

SYSTEMS = ("compute", "strata", "fsdp2", "plain")


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python3 -m strata.bench.gpu_peers",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="bf16",
                        help="strata's gradient and parameter dtype")
    parser.add_argument("--stream", choices=["on", "off"], default="on",
                        help="strata's streamed step: gradients leave during backward")
    parser.add_argument("--param-sync", choices=["eager", "per_module"], default="eager",
                        help="strata's parameters written into the model at the step, or each "
                        "module's just before its forward")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    # Internal: one system's worker.
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def model_params(args):
    return args.layers * (args.width * args.width + args.width)


def make_model(args, device):
    import torch
    torch.manual_seed(0)
    layers = []
    for i in range(args.layers):
        layers.append(torch.nn.Linear(args.width, args.width, device=device))
        if i + 1 < args.layers:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def gpu_used_bytes():
    import torch
    free, total = torch.cuda.mem_get_info()
    return total - free


def make_optimizer(args, model):
    """The system's model (wrapped where it wraps), optimizer and whatever
    must outlive the run."""
    import torch
    if args.worker == "compute":
        class NoOptimizer:
            def zero_grad(self):
                model.zero_grad(set_to_none=True)

            def step(self):
                pass
        return model, NoOptimizer(), None
    if args.worker == "plain":
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True), None
    if args.worker == "strata":
        import strata.torch
        from strata.cluster import LocalCluster
        # 12 bytes of state per parameter plus the copies, over the servers.
        budget_mib = int(model_params(args) * 20 / args.servers / (1 << 20)) + 256
        cluster = LocalCluster(servers=args.servers, host_budget_mib=budget_mib,
                               gpu_budget_mib=0, start_timeout_s=120.0)
        cluster.__enter__()
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        opt = strata.torch.ShardedOptimizer(
            model, coordinator=cluster.coordinator, job="gpu-peers", world_size=1,
            dtype=dtypes[args.dtype], lr=1e-4, timeout_s=600, stream=args.stream == "on",
            param_sync=args.param_sync)
        return model, opt, cluster
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    # args.out's directory is the run's own, fresh.
    dist.init_process_group("nccl", init_method=file_rendezvous(os.path.dirname(args.out)),
                            rank=0, world_size=1)
    policy = dict(offload_policy=CPUOffloadPolicy(),
                  mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                 reduce_dtype=torch.float32))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **policy)
    fully_shard(model, **policy)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4), None


def run_worker(args):
    """One system: times its steps and writes them to args.out."""
    import torch
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    before = gpu_used_bytes()
    # FSDP2 with CPU offload takes the model in host memory.
    model = make_model(args, "cpu" if args.worker == "fsdp2" else device)
    model, opt, keep = make_optimizer(args, model)
    generator = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(args.batch, args.width, device=device, generator=generator)
    y = torch.randn(args.batch, args.width, device=device, generator=generator)
    times = {"step": [], "forward_backward": [], "optimizer": []}
    if args.worker == "strata":
        times.update(collective=[], push_pull=[])
    peak = 0
    try:
        for i in range(args.warmup + args.steps):
            torch.cuda.synchronize()
            started = time.perf_counter()
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16,
                                enabled=args.worker != "fsdp2"):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            loss.backward()
            torch.cuda.synchronize()
            backward_done = time.perf_counter()
            peak = max(peak, gpu_used_bytes() - before)
            opt.step()
            torch.cuda.synchronize()
            done = time.perf_counter()
            peak = max(peak, gpu_used_bytes() - before)
            if i < args.warmup:
                continue
            times["step"].append(done - started)
            times["forward_backward"].append(backward_done - started)
            times["optimizer"].append(done - backward_done)
            if args.worker == "strata":
                times["collective"].append(opt.last_result["collective_seconds"])
                times["push_pull"].append(opt.last_result["push_pull_seconds"])
    finally:
        if keep is not None:
            keep.__exit__(None, None, None)
        if args.worker == "fsdp2":
            torch.distributed.destroy_process_group()
    result = {key: statistics.median(values) for key, values in times.items()}
    result["gpu_bytes"] = peak
    with open(args.out, "w") as f:
        json.dump(result, f)


def run_system(args, system):
    """Runs one system's worker to completion; returns its timings."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        argv = [sys.executable, "-m", "strata.bench.gpu_peers", "--worker", system, "--out", out,
                "--width", str(args.width), "--layers", str(args.layers),
                "--batch", str(args.batch), "--servers", str(args.servers),
                "--dtype", args.dtype, "--stream", args.stream,
                "--param-sync", args.param_sync, "--steps", str(args.steps),
                "--warmup", str(args.warmup)]
        subprocess.run(argv, check=True, timeout=1800)
        with open(out) as f:
            return json.load(f)


def summarize(args, results):
    summary = dict(model_params=model_params(args), batch=args.batch, servers=args.servers,
                   strata_dtype=args.dtype, strata_stream=args.stream,
                   strata_param_sync=args.param_sync)
    for system, r in results.items():
        if system == "compute":
            summary["forward_backward_s"] = r["forward_backward"]
        else:
            summary[system + "_step_s"] = r["step"]
        summary[system + "_gpu_bytes"] = r["gpu_bytes"]
    if "strata" in results:
        s = results["strata"]
        for peer in ("plain", "fsdp2"):
            if peer in results:
                summary["strata_over_" + peer] = s["step"] / results[peer]["step"]
        summary["strata_overhead_over_compute"] = s["step"] / s["forward_backward"] - 1
        summary["strata_breakdown_s"] = dict(
            forward_backward=s["forward_backward"], collectives=s["collective"],
            push_apply_pull=s["push_pull"],
            copies_and_python=s["optimizer"] - s["collective"] - s["push_pull"])
    return summary


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        run_worker(args)
        return 0
    results = {}
    for system in args.systems.split(","):
        if system not in SYSTEMS:
            raise SystemExit("--systems: %r is not one of %s" % (system, ", ".join(SYSTEMS)))
        results[system] = run_system(args, system)
        r = results[system]
        print("%-7s step %.4f s  forward+backward %.4f s  optimizer %.4f s  GPU %.2f GiB" % (
            system, r["step"], r["forward_backward"], r["optimizer"], r["gpu_bytes"] / 2**30),
            flush=True)
    print(json.dumps(summarize(args, results)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
