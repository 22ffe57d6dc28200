"""self_test.py: `check.py --self-test`. Breaks a copy of the example
overlay's rendered objects and Secrets in each way check.py must catch and
expects each reported (a fragment of the error), and the unbroken ones to
pass. Prints what was not caught; returns 1 if anything was not.
"""

import copy
import os
import subprocess
import tempfile

import check  # deploy/k8s/check.py


def find(objects, kind, name):
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def container(objects, kind, name):
    return find(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]


def set_flag(c, name, value):
    c["args"] = [("--%s=%s" % (name, value)) if a.startswith("--%s=" % name) else a
                 for a in c["args"]]


# Each breaks a copy of the example overlay's objects (and Secrets) and names
# a fragment of the error it must cause.
def _unknown_field(o, s):
    container(o, "StatefulSet", "strata-server")["volumeMount"] = []


def _missing_selector(o, s):
    del find(o, "StatefulSet", "strata-coordinator")["spec"]["selector"]


def _wrong_type(o, s):
    find(o, "Job", "strata-trainer")["spec"]["completions"] = "two"


def _coordinator_port(o, s):
    set_flag(container(o, "StatefulSet", "strata-server"), "coordinator", "strata-coordinator:7701")


def _coordinator_name(o, s):
    set_flag(container(o, "Job", "strata-trainer"), "coordinator", "coordinator:7700")


def _listen_port(o, s):
    set_flag(container(o, "StatefulSet", "strata-server"), "listen", "0.0.0.0:7702")


def _advertise(o, s):
    set_flag(container(o, "StatefulSet", "strata-server"), "advertise", "$(POD_NAME):7701")


def _undefined_var(o, s):
    set_flag(container(o, "StatefulSet", "strata-server"), "host_budget_mib", "$(HOST_BUDGET)")


def _missing_config_key(o, s):
    del find(o, "ConfigMap", "strata-config")["data"]["STRATA_NVME_BUDGET_MIB"]


def _missing_secret_key(o, s):
    del find(s, "Secret", "strata-trainer")["data"]["user.token"]


def _missing_secret(o, s):
    s.remove(find(s, "Secret", "strata-server-tls"))


def _memory(o, s):
    find(o, "ConfigMap", "strata-config")["data"]["STRATA_HOST_BUDGET_MIB"] = "8192"


def _prefault(o, s):
    find(o, "ConfigMap", "strata-config")["data"]["STRATA_HOST_PREFAULT_MIB"] = "4097"


def _nvme_volume(o, s):
    find(o, "ConfigMap", "strata-config")["data"]["STRATA_NVME_BUDGET_MIB"] = "65536"


def _unmounted_volume(o, s):
    spec = find(o, "StatefulSet", "strata-server")["spec"]["template"]["spec"]
    spec["containers"][0]["volumeMounts"] = [
        m for m in spec["containers"][0]["volumeMounts"] if m["name"] != "checkpoints"]


def _service_selector(o, s):
    find(o, "Service", "strata-server")["spec"]["selector"] = {"app.kubernetes.io/name": "nope"}


def _workers(o, s):
    find(o, "Job", "strata-trainer")["spec"]["parallelism"] = 3


def _probe_port(o, s):
    c = container(o, "StatefulSet", "strata-coordinator")
    c["readinessProbe"]["exec"]["command"][1] = "--target=127.0.0.1:7701"


def _namespace(o, s):
    find(o, "Job", "strata-trainer")["metadata"]["namespace"] = "elsewhere"


BREAKAGES = [
    (_unknown_field, "unknown field 'volumeMount'"),
    (_missing_selector, "`selector`, must not be `None`"),
    (_wrong_type, "completions: an integer expected"),
    (_coordinator_port, "has no port 7701"),
    (_coordinator_name, "names no Service"),
    (_listen_port, "--listen=0.0.0.0:7702 is not its grpc port"),
    (_advertise, "--advertise=$(POD_NAME):7701, not"),
    (_undefined_var, "$(HOST_BUDGET), which its env does not define"),
    (_missing_config_key, "STRATA_NVME_BUDGET_MIB of ConfigMap strata-config, which is not there"),
    (_missing_secret_key, "has no key user.token"),
    (_missing_secret, "Secret strata-server-tls, which make-secrets.sh does not make"),
    (_memory, "memory limit 6Gi is below"),
    (_prefault, "STRATA_HOST_PREFAULT_MIB (4097 MiB) exceeds the host budget (4096 MiB)"),
    (_nvme_volume, "volume nvme (20480 MiB) is below"),
    (_unmounted_volume, "volume checkpoints is mounted by no container"),
    (_service_selector, "Service/strata-server: its selector matches no pod template"),
    (_workers, "is not the Job's parallelism"),
    (_probe_port, "a probe checks 127.0.0.1:7701"),
    (_namespace, "every object and Secret in one namespace"),
]


def run():
    """Each breakage must be reported; the unbroken manifests must pass."""
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        objects, secrets, errors, _ = check.check_overlay(
            os.path.join(check.K8S_DIR, "overlays", "example"), tmp)
        if errors:
            print("self-test: the example overlay fails:\n  " + "\n  ".join(errors))
            return 1
        certificates = dict(check.CERTIFICATES)
        for breakage, expected in BREAKAGES:
            broken, broken_secrets = copy.deepcopy(objects), copy.deepcopy(secrets)
            breakage(broken, broken_secrets)
            found = check.check(broken, broken_secrets)
            check.CERTIFICATES.update(certificates)
            if not any(expected in e for e in found):
                failures += 1
                print("self-test: %s: expected '%s', got %s" % (breakage.__name__, expected, found))
        # A server certificate without the servers' names.
        subprocess.run(["bash", os.path.join(check.K8S_DIR, "..", "make-certs.sh"),
                        os.path.join(tmp, "other"), "strata-coordinator"],
                       check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(tmp, "other", "server.pem")) as f:
            check.CERTIFICATES["server.pem"] = f.read()
        found = check.check(objects, secrets)
        if not any("server.pem does not name it" in e for e in found):
            failures += 1
            print("self-test: a server certificate without the servers' names passed: %s" % found)
    print("self-test: %d breakages, %d not caught" % (len(BREAKAGES) + 1, failures))
    return 1 if failures else 0
