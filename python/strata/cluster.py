"""LocalCluster: a strata coordinator and shard servers on loopback, as child
processes, for the launcher, tests and benchmarks.

    with LocalCluster(servers=2) as cluster:
        ... cluster.coordinator ...   # "127.0.0.1:PORT"

The daemons' data and logs go to a temporary directory (removed on exit unless
`data_dir` is given); their binaries come from `binaries_dir()`. With
`tls_dir` (as deploy/make-certs.sh makes it: ca.pem, coordinator.pem/.key,
server.pem/.key) the daemons use TLS; with `auth_file` too, the coordinator
authenticates callers with it (--auth_file) and the servers with --auth. Not
thread-safe: one thread starts and stops a cluster.
"""

import os
import shutil
import subprocess
import tempfile
import time


def binaries_dir():
    """Where strata-coordinator and strata-server are: $STRATA_BIN, else the
    build tree this package was built in (build/python/strata -> build/bin),
    else the directory of the ones on PATH."""
    if os.environ.get("STRATA_BIN"):
        return os.environ["STRATA_BIN"]
    in_build = os.path.join(os.path.dirname(__file__), "..", "..", "bin")
    if os.path.exists(os.path.join(in_build, "strata-coordinator")):
        return os.path.abspath(in_build)
    on_path = shutil.which("strata-coordinator")
    if on_path:
        return os.path.dirname(on_path)
    raise FileNotFoundError(
        "strata-coordinator not found: set STRATA_BIN to the directory of the "
        "strata binaries (for example build/bin after `make build`)")


class LocalCluster:
    def __init__(self, servers=2, host_budget_mib=1024, data_dir=None, start_timeout_s=30.0,
                 tls_dir=None, auth_file=None, gpu_budget_mib=None):
        if auth_file and not tls_dir:
            raise ValueError("auth_file needs tls_dir: tokens travel over TLS only")
        self.servers = servers
        self.tls_dir = tls_dir
        self.auth_file = auth_file
        self.host_budget_mib = host_budget_mib
        self.gpu_budget_mib = gpu_budget_mib  # None: the server's default (GPU tier where found)
        self.start_timeout_s = start_timeout_s
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="strata-cluster-")
        self.coordinator = None
        self.server_addresses = []
        self._processes = []

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def _tls_flags(self, role):
        if not self.tls_dir:
            return []
        return ["--tls_cert=" + os.path.join(self.tls_dir, role + ".pem"),
                "--tls_key=" + os.path.join(self.tls_dir, role + ".key"),
                "--tls_ca=" + os.path.join(self.tls_dir, "ca.pem")]

    def start(self):
        bin_dir = binaries_dir()
        self.coordinator = self._start_daemon(
            "coordinator",
            [os.path.join(bin_dir, "strata-coordinator"), "--listen=127.0.0.1:0",
             "--data_dir=" + os.path.join(self.data_dir, "coordinator")]
            + self._tls_flags("coordinator")
            + (["--auth_file=" + self.auth_file] if self.auth_file else []))
        for i in range(self.servers):
            name = "server%d" % i
            self.server_addresses.append(self._start_daemon(
                name,
                [os.path.join(bin_dir, "strata-server"), "--listen=127.0.0.1:0",
                 "--coordinator=" + self.coordinator,
                 "--data_dir=" + os.path.join(self.data_dir, name),
                 "--checkpoint_root=" + self.data_dir,
                 "--host_budget_mib=%d" % self.host_budget_mib]
                + ([] if self.gpu_budget_mib is None
                   else ["--gpu_budget_mib=%d" % self.gpu_budget_mib])
                + self._tls_flags("server") + (["--auth"] if self.auth_file else [])))

    def _start_daemon(self, name, argv):
        ready = os.path.join(self.data_dir, name + ".addr")
        log_path = os.path.join(self.data_dir, name + ".log")
        with open(log_path, "wb") as log:
            process = subprocess.Popen(argv + ["--ready_file=" + ready], stdout=log,
                                       stderr=subprocess.STDOUT)
        self._processes.append(process)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(ready) and os.path.getsize(ready) > 0:
                with open(ready) as f:
                    return f.read().strip()
            if process.poll() is not None:
                raise RuntimeError("strata %s exited with %d during start-up; see %s"
                                   % (name, process.returncode, log_path))
            time.sleep(0.05)
        raise TimeoutError("strata %s did not start within %.0f s; see %s"
                           % (name, self.start_timeout_s, log_path))

    def server_pids(self):
        """The process ids of the running shard servers, in start order."""
        return [process.pid for process in self._processes[1:]]

    def stop(self):
        """SIGTERM to every daemon (servers first), then waits for them."""
        for process in reversed(self._processes):
            if process.poll() is None:
                process.terminate()
        for process in reversed(self._processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes = []
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
