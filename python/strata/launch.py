"""python -m strata.launch: starts the worker processes of a strata job.

    python3 -m strata.launch --workers 2 train.py [train.py's arguments]

Runs `train.py` in N processes with the interpreter running the launcher.
Each worker finds its job in its environment, which strata.torch's
ShardedOptimizer reads by default:

    STRATA_COORDINATOR  host:port of the coordinator
    STRATA_JOB          the job id (all workers of a launch share it)
    STRATA_WORLD_SIZE   the number of workers the job starts with
    STRATA_WORKER_ID    unique per worker: worker-0, worker-1, ...
    STRATA_LOCAL_RANK   0 .. N-1 (the rank is the client's, not this)
    STRATA_TLS_CA       with --tls-ca: the CA of a coordinator that uses TLS
                        (STRATA_TLS_CERT/STRATA_TLS_KEY, if set, are passed on)
    STRATA_TOKEN_FILE   with --token-file: the file of the token the workers
                        present to a coordinator that authenticates callers
                        (the user's: the job is created as theirs)
    STRATA_COLLECTIVE_HOST  with --collective-host: the address of this host
                        that the workers' collectives (Gloo) listen on and
                        announce to their peers
    GLIBC_TUNABLES      unless set already: glibc's malloc keeps the memory
                        it frees (MALLOC_TUNABLES below), as the shard
                        servers do (core/heap_retention.h): every step
                        receives the parameters again, and memory returned
                        to the kernel between steps is faulted in again

Without --coordinator it starts a local cluster (a coordinator and --servers
shard servers on loopback, see strata.cluster) and stops it afterwards. If a
worker fails, the others are stopped and the launcher exits with its status.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

from strata.cluster import LocalCluster

# glibc's trim threshold (1 GiB), mmap threshold (32 MiB) and arena limit
# (2), as core/heap_retention.h sets them in the shard servers.
MALLOC_TUNABLES = ("glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432"
                   ":glibc.malloc.arena_max=2")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python3 -m strata.launch",
        description="Start the workers of a strata job (and a local cluster when no "
                    "coordinator is given).")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--coordinator", default="",
                        help="host:port of a running coordinator; default: start a local "
                             "cluster")
    parser.add_argument("--tls-ca", default="",
                        help="CA certificate of a coordinator that uses TLS (passed to the "
                             "workers as STRATA_TLS_CA)")
    parser.add_argument("--token-file", default="",
                        help="file holding your token, for a coordinator that authenticates "
                             "callers (passed to the workers as STRATA_TOKEN_FILE; needs "
                             "--tls-ca)")
    parser.add_argument("--collective-host", default="",
                        help="this host's address for the workers' collectives, which "
                             "workers on other hosts connect to (passed to the workers as "
                             "STRATA_COLLECTIVE_HOST; default 127.0.0.1: one host)")
    parser.add_argument("--servers", type=int, default=2,
                        help="shard servers of the local cluster (default 2)")
    parser.add_argument("--host-budget-mib", type=int, default=1024,
                        help="host-tier budget of each local shard server (default 1024)")
    parser.add_argument("--job", default="",
                        help="job id (default: the script's name and the launcher's pid)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER,
                        help="arguments passed to the script")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.servers < 1:
        parser.error("--workers and --servers must be >= 1")
    if args.token_file and not args.tls_ca:
        parser.error("--token-file needs --tls-ca: a token is sent over TLS only")
    return args


def run_workers(args, coordinator):
    job = args.job or "%s-%d" % (os.path.splitext(os.path.basename(args.script))[0], os.getpid())
    workers = []
    for i in range(args.workers):
        env = dict(os.environ, STRATA_COORDINATOR=coordinator, STRATA_JOB=job,
                   STRATA_WORLD_SIZE=str(args.workers), STRATA_WORKER_ID="worker-%d" % i,
                   STRATA_LOCAL_RANK=str(i))
        env.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
        if args.tls_ca:
            env["STRATA_TLS_CA"] = args.tls_ca
        if args.token_file:
            env["STRATA_TOKEN_FILE"] = os.path.abspath(args.token_file)
        if args.collective_host:
            env["STRATA_COLLECTIVE_HOST"] = args.collective_host
        workers.append(subprocess.Popen([sys.executable, args.script] + args.script_args,
                                        env=env))
    return wait_for_workers(workers)


def wait_for_workers(workers, name="strata.launch", timeout_s=None):
    """Waits for every process of `workers` (rank order); at the first that
    fails, stops the others, and at `timeout_s` (None: no deadline) kills
    those left, saying so on stderr as `name`. Returns 0, or the first
    failure's exit status (128 + N for signal N; 124 at the deadline)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    status = 0
    try:
        running = list(workers)
        while running:
            if deadline is not None and time.monotonic() >= deadline:
                print("%s: worker(s) %s still running after %d s; stopping them"
                      % (name, ", ".join(str(workers.index(w)) for w in running), timeout_s),
                      file=sys.stderr)
                return status or 124
            for worker in list(running):
                code = worker.poll()
                if code is None:
                    continue
                running.remove(worker)
                if code != 0 and status == 0:
                    status = code if code > 0 else 128 - code
                    print("%s: worker %d exited with %d; stopping the others"
                          % (name, workers.index(worker), code), file=sys.stderr)
                    for other in running:
                        other.terminate()
            time.sleep(0.05)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    return status


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # SIGTERM ends the launch like Ctrl-C: workers and cluster are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.coordinator:
        return run_workers(args, args.coordinator)
    with LocalCluster(servers=args.servers, host_budget_mib=args.host_budget_mib) as cluster:
        return run_workers(args, cluster.coordinator)


if __name__ == "__main__":
    sys.exit(main())
