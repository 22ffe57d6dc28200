#!/usr/bin/env python3
"""check.py: validates strata's Kubernetes manifests without a cluster.

    python3 deploy/k8s/check.py [OVERLAY_DIR ...]      (default: every overlay)
    python3 deploy/k8s/check.py --self-test

For each overlay it renders the kustomization (render.py; and with
`kubectl kustomize` too where a kubectl with kustomize >= v4 is installed,
which must give the same objects), makes the Secrets for the overlay's
namespace with make-secrets.sh, and then checks:
  - every object against the Kubernetes API schema: the models of the
    official Python client (Debian's python3-kubernetes): no unknown
    field, every required one, each value of its type;
  - the cross-references: ConfigMap and Secret keys, volumes and their
    mounts, claims, $(VAR)s, Service selectors and ports, the addresses the
    daemons listen on, advertise, dial and probe, the names the TLS
    certificates must cover, files read from mounted Secrets, the trainer
    count, the namespace;
  - the resources tied to the budgets of config.yaml (server memory and
    volumes).
Prints each problem as OVERLAY: OBJECT: what is wrong, and exits 1 if any.
--self-test (self_test.py) breaks the rendered manifests in ways each check
must catch.
"""

import fnmatch
import os
import re
import subprocess
import sys
import tempfile

import yaml

import kubernetes.client as k8s

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render  # noqa: E402  (deploy/k8s/render.py)

K8S_DIR = os.path.dirname(os.path.abspath(__file__))

MODELS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("batch/v1", "Job"): "V1Job",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
}

# MiB the server needs beyond its budgets (config.yaml).
SERVER_OVERHEAD_MIB = 1024

QUANTITY_UNITS = {"": 1, "k": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4,
                  "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def parse_bytes(quantity):
    match = re.fullmatch(r"([0-9]+)([kMGT]i?|)", str(quantity))
    if not match or (match.group(2) not in QUANTITY_UNITS):
        raise ValueError("'%s' is not a byte quantity" % quantity)
    return int(match.group(1)) * QUANTITY_UNITS[match.group(2)]


def name_of(obj):
    return "%s/%s" % (obj.get("kind"), obj.get("metadata", {}).get("name"))


# ---- schema -----------------------------------------------------------------

def check_value(value, type_name, path, errors):
    if type_name.startswith("list["):
        if not isinstance(value, list):
            errors.append("%s: a list expected, not %r" % (path, value))
            return
        for i, item in enumerate(value):
            check_value(item, type_name[5:-1], "%s[%d]" % (path, i), errors)
    elif type_name.startswith("dict("):
        if not isinstance(value, dict):
            errors.append("%s: a map expected, not %r" % (path, value))
            return
        inner = type_name[5:-1].split(", ", 1)[1]
        for key, item in value.items():
            check_value(item, inner, "%s.%s" % (path, key), errors)
    elif type_name == "str":
        if not isinstance(value, str):
            errors.append("%s: a string expected, not %r" % (path, value))
    elif type_name == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append("%s: an integer expected, not %r" % (path, value))
    elif type_name == "bool":
        if not isinstance(value, bool):
            errors.append("%s: true or false expected, not %r" % (path, value))
    elif type_name == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            errors.append("%s: a number expected, not %r" % (path, value))
    elif type_name in ("object", "datetime", "date"):
        pass  # int-or-string and free-form fields
    else:
        check_model(value, getattr(k8s, type_name), path, errors)


def check_model(value, model, path, errors):
    if not isinstance(value, dict):
        errors.append("%s: an object (%s) expected, not %r" % (path, model.__name__, value))
        return
    attribute_of = {json: attr for attr, json in model.attribute_map.items()}
    present = {}
    for key, item in value.items():
        if key not in attribute_of:
            errors.append("%s: unknown field '%s' (%s)" % (path, key, model.__name__))
            continue
        present[attribute_of[key]] = item
        check_value(item, model.openapi_types[attribute_of[key]], "%s.%s" % (path, key), errors)
    try:  # the client's models refuse a missing required field and bad enums
        model(**present)
    except (ValueError, TypeError) as e:
        errors.append("%s: %s" % (path, str(e).replace("\n", " ")))


def check_schema(obj, errors):
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in MODELS:
        errors.append("%s: apiVersion %s kind %s is not one this checks" % (name_of(obj), *key))
        return
    check_model(obj, getattr(k8s, MODELS[key]), name_of(obj), errors)


# ---- cross-references -------------------------------------------------------

def pod_specs(objects):
    """(owner, pod template, owner's volumeClaimTemplates) of each workload."""
    for obj in objects:
        if obj["kind"] in ("StatefulSet", "Job"):
            spec = obj["spec"]
            yield obj, spec["template"], spec.get("volumeClaimTemplates", [])


def flag(args, name):
    """The value of --name=VALUE in args, or None."""
    for arg in args:
        if arg.startswith("--%s=" % name):
            return arg.split("=", 1)[1]
    return None


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def covered_by(name, sans):
    return any(fnmatch.fnmatchcase(name, san) if san.startswith("*.") and name.count(".") ==
               san.count(".") else name == san for san in sans)


def certificate_names(pem):
    text = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"], input=pem,
                          capture_output=True, text=True, check=True).stdout
    return re.findall(r"DNS:([^,\s]+)", text)


def check_references(objects, secrets, errors):
    by_kind = {}
    for obj in objects + secrets:
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
    config_maps, secret_objs = by_kind.get("ConfigMap", {}), by_kind.get("Secret", {})
    services = by_kind.get("Service", {})
    namespaces = {obj["metadata"].get("namespace") for obj in objects + secrets}
    if len(namespaces) != 1 or None in namespaces:
        errors.append("namespaces: every object and Secret in one namespace, not %s"
                      % sorted(map(str, namespaces)))
    namespace = next(iter(namespaces))

    def secret_data(name):
        secret = secret_objs.get(name)
        return None if secret is None else secret.get("data", {})

    for obj in objects:
        if obj["kind"] == "Service":
            selected = [o for o, template, _ in pod_specs(objects)
                        if labels_match(obj["spec"].get("selector", {}), template)]
            if not selected:
                errors.append("%s: its selector matches no pod template" % name_of(obj))
            for port in obj["spec"].get("ports", []):
                for owner in selected:
                    names = {p.get("name") for c in owner["spec"]["template"]["spec"]["containers"]
                             for p in c.get("ports", [])}
                    if port.get("targetPort") not in names:
                        errors.append("%s: targetPort %s is no container port of %s"
                                      % (name_of(obj), port.get("targetPort"), name_of(owner)))
        if obj["kind"] == "PodDisruptionBudget":
            if not any(labels_match(obj["spec"]["selector"]["matchLabels"], template)
                       for _, template, _ in pod_specs(objects)):
                errors.append("%s: its selector matches no pod template" % name_of(obj))

    for owner, template, claims in pod_specs(objects):
        where = name_of(owner)
        # (A Job's selector is the controller's to make.)
        if owner["kind"] == "StatefulSet":
            if not labels_match(owner["spec"]["selector"].get("matchLabels", {}), template):
                errors.append("%s: selector does not match its pod template" % where)
            service = services.get(owner["spec"].get("serviceName"))
            if service is None or service["spec"].get("clusterIP") != "None":
                errors.append("%s: serviceName %s is no headless Service"
                              % (where, owner["spec"].get("serviceName")))
            elif not labels_match(service["spec"]["selector"], template):
                errors.append("%s: Service %s does not select its pods"
                              % (where, service["metadata"]["name"]))
        pod = template["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claim_names = {c["metadata"]["name"] for c in claims}
        mounted = set()
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                if claim not in by_kind.get("PersistentVolumeClaim", {}):
                    errors.append("%s: volume %s claims %s, which no manifest defines"
                                  % (where, volume["name"], claim))
            if "secret" in volume and secret_data(volume["secret"]["secretName"]) is None:
                errors.append("%s: volume %s mounts Secret %s, which make-secrets.sh does not "
                              "make" % (where, volume["name"], volume["secret"]["secretName"]))
        for container in pod["containers"]:
            cwhere = "%s container %s" % (where, container["name"])
            env = {}
            for var in container.get("env", []):
                env[var["name"]] = var
                ref = var.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    cm = config_maps.get(ref["configMapKeyRef"]["name"])
                    if cm is None or ref["configMapKeyRef"]["key"] not in cm.get("data", {}):
                        errors.append("%s: env %s reads %s of ConfigMap %s, which is not there"
                                      % (cwhere, var["name"], ref["configMapKeyRef"]["key"],
                                         ref["configMapKeyRef"]["name"]))
            secret_files = {}  # mounted path -> its Secret's data, for file checks
            for mount in container.get("volumeMounts", []):
                mounted.add(mount["name"])
                if mount["name"] not in volumes and mount["name"] not in claim_names:
                    errors.append("%s: volumeMount %s names no volume or claim template"
                                  % (cwhere, mount["name"]))
                volume = volumes.get(mount["name"], {})
                if "secret" in volume:
                    secret_files[mount["mountPath"]] = secret_data(
                        volume["secret"]["secretName"]) or {}
            words = list(container.get("command", [])) + list(container.get("args", []))
            probes = [container.get(p, {}).get("exec", {}).get("command", [])
                      for p in ("startupProbe", "readinessProbe", "livenessProbe")]
            for word in words + [w for probe in probes for w in probe]:
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", word):
                    if var not in env:
                        errors.append("%s: %s uses $(%s), which its env does not define"
                                      % (cwhere, word, var))
                for path in re.findall(r"(/[^\s=,]+)", word):
                    for root, data in secret_files.items():
                        if path.startswith(root + "/") and path[len(root) + 1:] not in data:
                            errors.append("%s: reads %s, but its Secret has no key %s"
                                          % (cwhere, path, path[len(root) + 1:]))
            check_addresses(container, cwhere, words, probes, template, owner, services,
                            namespace, secret_files, errors)
            if owner["kind"] == "StatefulSet" and container["name"] == "server":
                check_budgets(container, claims, config_maps.get("strata-config", {}), cwhere,
                              errors)
            if owner["kind"] == "Job":
                workers = flag(container.get("args", []), "workers")
                for field in ("parallelism", "completions"):
                    if workers is None or str(owner["spec"].get(field)) != workers:
                        errors.append("%s: --workers=%s is not the Job's %s (%s)"
                                      % (cwhere, workers, field, owner["spec"].get(field)))
        for name in set(volumes) - mounted:
            errors.append("%s: volume %s is mounted by no container" % (where, name))
        for name in claim_names - mounted:
            errors.append("%s: claim template %s is mounted by no container" % (where, name))


def labels_match(selector, template):
    labels = template.get("metadata", {}).get("labels", {})
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_addresses(container, where, words, probes, template, owner, services, namespace,
                    secret_files, errors):
    """The ports a daemon listens on, advertises and is probed on agree with
    its container's ports; the addresses it dials name a Service's port;
    each name dialled over TLS is one its peer's certificate covers."""
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    args = container.get("args", [])
    listen, metrics = flag(args, "listen"), flag(args, "metrics_listen")
    if listen is not None and port_of(listen) != ports.get("grpc"):
        errors.append("%s: --listen=%s is not its grpc port %s" % (where, listen, ports.get("grpc")))
    if metrics is not None:
        if port_of(metrics) != ports.get("metrics"):
            errors.append("%s: --metrics_listen=%s is not its metrics port %s"
                          % (where, metrics, ports.get("metrics")))
        scraped = template["metadata"].get("annotations", {}).get("prometheus.io/port")
        if scraped != str(port_of(metrics)):
            errors.append("%s: prometheus.io/port %s is not --metrics_listen's port"
                          % (where, scraped))
    for probe in probes:
        target = flag(probe, "target")
        if probe and (target is None or port_of(target) != ports.get("grpc")):
            errors.append("%s: a probe checks %s, not its grpc port %s"
                          % (where, target, ports.get("grpc")))
    ca_dir = next((root for root, data in secret_files.items() if "ca.pem" in data), None)
    dialled = []
    coordinator = flag(args, "coordinator")
    if coordinator is not None:
        host, port = coordinator.rsplit(":", 1)
        service = services.get(host.split(".")[0])
        if service is None or host not in (service["metadata"]["name"], "%s.%s.svc" % (
                service["metadata"]["name"], namespace)):
            errors.append("%s: --coordinator=%s names no Service of this namespace"
                          % (where, coordinator))
        else:
            if int(port) not in [p["port"] for p in service["spec"]["ports"]]:
                errors.append("%s: --coordinator=%s: Service %s has no port %s"
                              % (where, coordinator, host, port))
            dialled.append((host, "coordinator.pem"))
    advertise = flag(args, "advertise")
    if advertise is not None and owner["kind"] == "StatefulSet":
        expected = "$(POD_NAME).%s.$(POD_NAMESPACE).svc:%s" % (owner["spec"]["serviceName"],
                                                             ports.get("grpc"))
        if advertise != expected:
            errors.append("%s: --advertise=%s, not %s (its stable DNS name and grpc port)"
                          % (where, advertise, expected))
        dialled.append(("%s-0.%s.%s.svc" % (owner["metadata"]["name"],
                                             owner["spec"]["serviceName"], namespace),
                        "server.pem"))
    if ca_dir is not None:
        for host, certificate in dialled:
            pem = CERTIFICATES.get(certificate)
            if pem is not None and not covered_by(host, certificate_names(pem)):
                errors.append("%s: %s is dialled over TLS, but %s does not name it"
                              % (where, host, certificate))


def check_budgets(container, claims, config, where, errors):
    data = config.get("data", {})
    try:
        host = int(data["STRATA_HOST_BUDGET_MIB"]) << 20
        prefault = int(data["STRATA_HOST_PREFAULT_MIB"]) << 20
        checkpoints = int(data["STRATA_CHECKPOINT_MEMORY_LIMIT_MIB"]) << 20
        nvme = int(data["STRATA_NVME_BUDGET_MIB"]) << 20
        limits = container["resources"]["limits"]
        requests = container["resources"]["requests"]
        memory = parse_bytes(limits["memory"])
        sizes = {c["metadata"]["name"]: parse_bytes(c["spec"]["resources"]["requests"]["storage"])
                 for c in claims}
    except (KeyError, ValueError) as e:
        errors.append("%s: budgets or resources unreadable: %s" % (where, e))
        return
    if prefault > host:
        errors.append("%s: STRATA_HOST_PREFAULT_MIB (%d MiB) exceeds the host budget (%d MiB): "
                      "the server would not start" % (where, prefault >> 20, host >> 20))
    need = host + checkpoints + (SERVER_OVERHEAD_MIB << 20)
    if memory < need:
        errors.append("%s: memory limit %s is below the host budget + checkpoint memory + %d MiB "
                      "(%d MiB)" % (where, limits["memory"], SERVER_OVERHEAD_MIB, need >> 20))
    if requests.get("memory") != limits["memory"]:
        errors.append("%s: memory request %s is not its limit %s (Guaranteed)"
                      % (where, requests.get("memory"), limits["memory"]))
    if sizes.get("nvme", 0) < nvme:
        errors.append("%s: volume nvme (%d MiB) is below the NVMe budget (%d MiB)"
                      % (where, sizes.get("nvme", 0) >> 20, nvme >> 20))
    if sizes.get("data", 0) < host + (SERVER_OVERHEAD_MIB << 20):
        errors.append("%s: volume data (%d MiB) is below the host budget + %d MiB, which a clean "
                      "shutdown saves there" % (where, sizes.get("data", 0) >> 20,
                                                SERVER_OVERHEAD_MIB))


# ---- driving ----------------------------------------------------------------

CERTIFICATES = {}  # file name -> PEM text of the overlay being checked


def make_secrets(namespace, directory):
    subprocess.run(["bash", os.path.join(K8S_DIR, "make-secrets.sh"), namespace, directory],
                   check=True, stdout=subprocess.DEVNULL)
    for name in ("coordinator.pem", "server.pem"):
        with open(os.path.join(directory, name)) as f:
            CERTIFICATES[name] = f.read()
    with open(os.path.join(directory, "secrets.yaml")) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def check(objects, secrets):
    errors = []
    for obj in objects + secrets:
        check_schema(obj, errors)
    if not errors:  # references assume the schema's shapes
        check_references(objects, secrets, errors)
    return errors


def kubectl_render(overlay):
    """The objects `kubectl kustomize` renders, or None without a kubectl
    whose kustomize reads this layout (>= v4)."""
    try:
        done = subprocess.run(["kubectl", "kustomize", overlay], capture_output=True, text=True,
                              timeout=60)
    except FileNotFoundError:
        return None
    if done.returncode != 0:
        print("check.py: `kubectl kustomize` cannot render %s (kustomize < v4?): %s"
              % (overlay, done.stderr.strip().splitlines()[-1:]), file=sys.stderr)
        return None
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def canonical(objects):
    return sorted(objects, key=lambda o: (o["kind"], o["metadata"]["name"]))


def check_overlay(overlay, secrets_dir):
    objects = render.render(overlay)
    errors = []
    real = kubectl_render(overlay)
    if real is not None and canonical(real) != canonical(objects):
        errors.append("render.py and `kubectl kustomize` disagree")
    namespace = objects[0]["metadata"].get("namespace") or "default"
    secrets = make_secrets(namespace, secrets_dir)
    return objects, secrets, errors + check(objects, secrets), real is not None


def overlays():
    root = os.path.join(K8S_DIR, "overlays")
    return [os.path.join(root, name) for name in sorted(os.listdir(root))]


def main(argv):
    if argv == ["--self-test"]:
        import self_test  # noqa: E402  (deploy/k8s/self_test.py)
        return self_test.run()
    status = 0
    for overlay in argv or overlays():
        with tempfile.TemporaryDirectory() as tmp:
            objects, _, errors, by_kubectl = check_overlay(overlay, tmp)
        label = os.path.relpath(overlay, K8S_DIR)
        for error in errors:
            print("%s: %s" % (label, error))
        print("%s: %d objects, %s%s" % (label, len(objects),
                                        "%d problems" % len(errors) if errors else "valid",
                                        ", rendered alike by kubectl kustomize" if by_kubectl
                                        else ""))
        status |= 1 if errors else 0
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
