"""python3 -m strata.bench.peers: strata against what its users run today.

Trains the same model (an MLP of --layers Linear(--width, --width) layers,
50 M parameters by default) with the same global batch on --workers worker
processes four ways, one after the other:

  compute the forward and backward alone (no optimizer, no communication):
          the bound every step is measured against
  strata  strata.torch.ShardedOptimizer, a local cluster of --servers shard
          servers (strata.cluster; workers by strata.launch), --dtype
          gradients and parameters,
          --params replicated or on_demand (then also its parameter memory),
          --stream on (gradients leave during backward) or off,
          --param-sync eager (the step writes every parameter) or per_module
          (each module's just before its forward); with eager, each worker
          also runs the compute step on a plain copy of the model after each
          of strata's steps, and overhead_over_compute is the median over
          those pairs (overhead_measured "paired"; the compute run's own
          figure is then forward_backward_separate_run_s), since this
          machine's speed may drift between two runs minutes apart
  ddp     torch.nn.parallel.DistributedDataParallel + torch.optim.AdamW (Gloo;
          with the FP16 compression hook when strata runs BF16 or FP16: the
          same bytes on the wire; torch 1.13's BF16 hook needs NCCL)
  zero    torch.distributed.optim.ZeroRedundancyOptimizer(AdamW) (Gloo)

Every worker process uses --threads torch threads; the shard servers use
their default executor threads. Every system's processes run
with glibc's malloc keeping the memory it frees (strata.launch's
MALLOC_TUNABLES, unless GLIBC_TUNABLES is set). With --jemalloc the torch
runs are repeated with Debian's libjemalloc2 preloaded (it makes torch's CPU
optimizer much faster here) and the faster of each pair is compared. Prints
one line per run and, last, one JSON object: model_params, forward_backward_s,
strata_step_s, ddp_step_s, zero_step_s, overhead_over_compute (strata's step
over the forward+backward alone, minus 1), strata_optimizer_s,
zero_optimizer_s, ddp_optimizer_s, the ratios, each system's CPU seconds per
step of a worker (rank 0), the shard servers' CPU seconds per step
(strata_servers_cpu_s all together, strata_server_cpu_s each: the mean over
the timed steps), and where strata's step goes (forward/backward,
gradient copy, collectives -- reduce-scatter and norm; a replicated job's
all-gather runs after the client's step returns and counts in the copy-back
that waits for it --, push/pull with the servers' apply, parameter
copy-back). A step is the median over --steps steps after --warmup.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from strata.cluster import LocalCluster
from strata.launch import MALLOC_TUNABLES, wait_for_workers

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
# How long a peer's collective (Gloo) may wait for the other workers before
# it fails instead of hanging.
PEER_COLLECTIVE_TIMEOUT_S = 300


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python3 -m strata.bench.peers",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="global batch")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="bf16",
                        help="strata's gradient and parameter dtype")
    parser.add_argument("--params", choices=["replicated", "on_demand"], default="replicated",
                        help="strata's parameters: whole model per worker, or gathered per layer")
    parser.add_argument("--stream", choices=["on", "off"], default="on",
                        help="strata's streamed step: gradients leave during backward")
    parser.add_argument("--param-sync", choices=["eager", "per_module"], default="eager",
                        help="strata's parameters written into the model at the step, or each "
                        "module's just before its forward")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--systems", default="compute,strata,ddp,zero")
    parser.add_argument("--jemalloc", action="store_true",
                        help="also run ddp and zero with libjemalloc2 preloaded")
    parser.add_argument("--json", action="store_true", help="(the JSON line is always printed)")
    # Internal: one worker of one system.
    parser.add_argument("--worker", choices=["compute", "strata", "ddp", "zero"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--server-pids", default="", help=argparse.SUPPRESS)
    parser.add_argument("--rendezvous", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def make_model(args):
    import torch
    torch.manual_seed(0)
    layers = []
    for i in range(args.layers):
        layers.append(torch.nn.Linear(args.width, args.width))
        if i + 1 < args.layers:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def run_worker(args):
    """One worker: times its steps; rank 0 writes them to args.out."""
    import torch
    torch.set_num_threads(args.threads)
    model = make_model(args)
    share = args.batch // args.workers
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.width, generator=generator)
    y = torch.randn(args.batch, args.width, generator=generator)
    times = {"step": [], "optimizer": [], "forward_backward": [], "cpu": []}
    if args.worker == "compute":
        rank, train = int(os.environ["RANK"]), model

        class NoOptimizer:
            def zero_grad(self):
                model.zero_grad(set_to_none=True)

            def step(self):
                pass
        opt = NoOptimizer()
    elif args.worker == "strata":
        import strata.torch
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        opt = strata.torch.ShardedOptimizer(model, dtype=dtypes[args.dtype], lr=1e-4,
                                            timeout_s=600, params=args.params,
                                            stream=args.stream == "on",
                                            param_sync=args.param_sync)
        rank, train = opt.rank, model
        for key in ("collective", "push_pull"):
            times[key] = []
    else:
        import torch.distributed as dist
        dist.init_process_group(
            "gloo", init_method=args.rendezvous, rank=int(os.environ["RANK"]),
            world_size=args.workers,
            timeout=datetime.timedelta(seconds=PEER_COLLECTIVE_TIMEOUT_S))
        rank = dist.get_rank()
        train = torch.nn.parallel.DistributedDataParallel(model)
        if args.worker == "ddp" and args.dtype != "fp32":
            # 16-bit gradients on the wire as strata's: FP16 also for BF16
            # (torch 1.13's BF16 hook needs NCCL).
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            train.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
        if args.worker == "ddp":
            opt = torch.optim.AdamW(train.parameters(), lr=1e-4)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(train.parameters(), optimizer_class=torch.optim.AdamW,
                                          lr=1e-4)
    mine = slice(rank * share, (rank + 1) * share)
    server_pids = [int(pid) for pid in args.server_pids.split(",") if pid]
    # The bound beside strata's steps: after each, the same forward+backward
    # on a plain copy of the model, so that the two see the machine at the
    # same moment (its speed drifts from minute to minute). Not with
    # per-module parameter sync, whose all-gather runs on past step().
    bound = None
    if args.worker == "strata" and args.param_sync == "eager":
        bound = make_model(args)
        times["paired_forward_backward"], times["paired_cpu"] = [], []
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            servers_cpu_started = processes_cpu_seconds(server_pids)
        started = time.perf_counter()
        cpu_started = time.process_time()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(train(x[mine]), y[mine])
        loss.backward()
        backward_done = time.perf_counter()
        opt.step()
        done = time.perf_counter()
        if i >= args.warmup:
            times["step"].append(done - started)
            times["forward_backward"].append(backward_done - started)
            times["optimizer"].append(done - backward_done)
            times["cpu"].append(time.process_time() - cpu_started)
            if args.worker == "strata":
                times["collective"].append(opt.last_result["collective_seconds"])
                times["push_pull"].append(opt.last_result["push_pull_seconds"])
        if bound is not None:
            started = time.perf_counter()
            cpu_started = time.process_time()
            bound.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(bound(x[mine]), y[mine]).backward()
            if i >= args.warmup:
                times["paired_forward_backward"].append(time.perf_counter() - started)
                times["paired_cpu"].append(time.process_time() - cpu_started)
    if args.worker in ("ddp", "zero"):
        # Every rank's collectives are done before any rank leaves.
        torch.distributed.barrier()
    if rank == 0:
        result = {key: statistics.median(values) for key, values in times.items()}
        if bound is not None:
            result["paired_overhead"] = statistics.median(
                step / compute - 1
                for step, compute in zip(times["step"], times["paired_forward_backward"]))
        if args.worker == "strata":
            result["param_memory"] = opt.param_memory()
            result["servers_cpu"] = ((processes_cpu_seconds(server_pids) - servers_cpu_started)
                                     / args.steps)
        with open(args.out, "w") as f:
            json.dump(result, f)


def processes_cpu_seconds(pids):
    """The user and system CPU seconds the processes `pids` have used."""
    total = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


def file_rendezvous(directory):
    """A torch.distributed init_method in `directory`, which must be empty:
    a file, not a TCP port, which another process could take between being
    picked free and rank 0 listening on it."""
    return "file://" + os.path.join(directory, "rendezvous")


def worker_argv(args, system, out):
    return ["--worker", system, "--out", out, "--width", str(args.width),
            "--layers", str(args.layers), "--batch", str(args.batch),
            "--workers", str(args.workers), "--threads", str(args.threads),
            "--dtype", args.dtype, "--params", args.params, "--stream", args.stream,
            "--param-sync", args.param_sync,
            "--steps", str(args.steps),
            "--warmup", str(args.warmup)]


def run_system(args, system, jemalloc=False):
    """Runs one system's workers to completion; returns rank 0's timings."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        # Every system's processes keep freed memory as strata.launch's
        # workers do (unless the caller set GLIBC_TUNABLES).
        env = dict(os.environ)
        env.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
        if jemalloc:
            env["LD_PRELOAD"] = JEMALLOC
        if system == "strata":
            # 12 bytes of state per parameter plus the copies, over the servers.
            params = args.layers * (args.width * args.width + args.width)
            budget_mib = int(params * 20 / args.servers / (1 << 20)) + 256
            with LocalCluster(servers=args.servers, host_budget_mib=budget_mib) as cluster:
                pids = ",".join(str(pid) for pid in cluster.server_pids())
                subprocess.run([sys.executable, "-m", "strata.launch", "--workers",
                                str(args.workers), "--coordinator", cluster.coordinator,
                                __file__] + worker_argv(args, system, out) +
                               ["--server-pids", pids], env=env, check=True, timeout=1800)
        else:
            argv = ([sys.executable, __file__] + worker_argv(args, system, out) +
                    ["--rendezvous", file_rendezvous(tmp)])
            workers = [subprocess.Popen(argv, env=dict(env, RANK=str(r)))
                       for r in range(args.workers)]
            status = wait_for_workers(workers, name="strata.bench.peers " + system,
                                      timeout_s=1800)
            if status != 0:
                raise RuntimeError("%s workers ended with status %d" % (system, status))
        with open(out) as f:
            return json.load(f)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        run_worker(args)
        if args.worker in ("ddp", "zero"):
            # Leaves without tearing the process group down: torch 1.13's
            # ProcessGroupGloo destructor joins its threads with the GIL
            # held, and one may still need the GIL to drop a DDP comm hook's
            # Python callback, so the teardown can hang for good.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return 0
    if args.batch % args.workers != 0:
        raise SystemExit("--batch must be a multiple of --workers")
    if args.jemalloc and not os.path.exists(JEMALLOC):
        raise SystemExit("--jemalloc needs %s (Debian package libjemalloc2)" % JEMALLOC)
    systems = args.systems.split(",")
    results = {}
    for system in systems:
        results[system] = run_system(args, system)
        r = results[system]
        paired = ("  paired compute step %.3f s" % r["paired_forward_backward"]
                  if "paired_forward_backward" in r else "")
        print("%-6s step %.3f s  optimizer %.3f s  forward+backward %.3f s%s" % (
            system, r["step"], r["optimizer"], r["forward_backward"], paired), flush=True)
        if args.jemalloc and system in ("ddp", "zero"):
            name = system + "_jemalloc"
            results[name] = run_system(args, system, jemalloc=True)
            print("%-6s step %.3f s  optimizer %.3f s  (jemalloc)" % (
                system, results[name]["step"], results[name]["optimizer"]), flush=True)

    summary = dict(model_params=args.layers * (args.width * args.width + args.width),
                   workers=args.workers, servers=args.servers, threads=args.threads,
                   batch=args.batch, strata_dtype=args.dtype, strata_params=args.params)
    summary["strata_stream"] = args.stream
    summary["strata_param_sync"] = args.param_sync
    for system, r in results.items():
        if system == "compute":
            summary["forward_backward_s"] = r["forward_backward"]
            summary["compute_cpu_s"] = r["cpu"]
            continue
        summary[system + "_step_s"] = r["step"]
        summary[system + "_optimizer_s"] = r["optimizer"]
        summary[system + "_cpu_s"] = r["cpu"]
    if "strata" in results and "paired_overhead" in results["strata"]:
        s = results["strata"]
        if "compute" in results:
            summary["forward_backward_separate_run_s"] = summary["forward_backward_s"]
        summary["forward_backward_s"] = s["paired_forward_backward"]
        summary["compute_cpu_s"] = s["paired_cpu"]
        summary["overhead_over_compute"] = s["paired_overhead"]
        summary["overhead_measured"] = "paired"
    elif "compute" in results and "strata" in results:
        summary["overhead_over_compute"] = (results["strata"]["step"] /
                                            results["compute"]["forward_backward"] - 1)
        summary["overhead_measured"] = "separate runs"
    for peer in ("ddp", "zero"):
        best = min((k for k in (peer, peer + "_jemalloc") if k in results),
                   key=lambda k: results[k]["step"], default=None)
        if best and "strata" in results:
            summary["strata_over_%s_step" % peer] = results["strata"]["step"] / results[best]["step"]
            summary["%s_compared" % peer] = best
    peer_steps = [results[k]["step"] for k in ("ddp", "ddp_jemalloc", "zero", "zero_jemalloc")
                  if k in results]
    if peer_steps and "strata" in results:
        summary["strata_over_best_peer_step"] = results["strata"]["step"] / min(peer_steps)
    if "strata" in results:
        s = results["strata"]
        summary["strata_breakdown_s"] = dict(
            forward_backward=s["forward_backward"], collectives=s["collective"],
            push_apply_pull=s["push_pull"],
            copies_and_python=s["optimizer"] - s["collective"] - s["push_pull"])
        summary["strata_param_memory"] = s["param_memory"]
        summary["strata_servers_cpu_s"] = s["servers_cpu"]
        summary["strata_server_cpu_s"] = s["servers_cpu"] / args.servers
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
