"""render.py: renders a kustomization the way `kubectl kustomize` does, for
the subset of kustomize that deploy/k8s uses, so that check.py needs no
kubectl: `resources` (files and directories), `patches` (strategic-merge
files), `namespace` and `images`. Any other field is refused, so that this
cannot silently render something other than kustomize would; where a
kubectl with kustomize >= v4 is installed, check.py compares the two.

    python3 deploy/k8s/render.py OVERLAY_DIR     prints the objects as YAML
"""

import os
import sys

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "patches", "namespace", "images"}

# The merge keys of the lists a strategic-merge patch merges item by item
# (Kubernetes' patchMergeKey); every other list is replaced whole.
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
              "volumeMounts": "mountPath", "ports": "containerPort"}


def load(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def merge(target, patch):
    """Applies strategic-merge `patch` to dict `target` in place."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        elif (isinstance(value, list) and key in MERGE_KEYS
              and isinstance(target.get(key), list)):
            merge_key = MERGE_KEYS[key]
            for item in value:
                match = next((t for t in target[key] if t.get(merge_key) == item.get(merge_key)),
                             None)
                if match is None:
                    target[key].append(item)
                else:
                    merge(match, item)
        else:
            target[key] = value


def render(directory):
    """The objects of the kustomization in `directory`; raises ValueError for
    a field or a patch this cannot render."""
    path = os.path.join(directory, "kustomization.yaml")
    (kustomization,) = load(path)
    unsupported = set(kustomization) - SUPPORTED
    if unsupported:
        raise ValueError("%s: render.py does not render %s" % (path, sorted(unsupported)))
    objects = []
    for resource in kustomization.get("resources", []):
        resource = os.path.join(directory, resource)
        objects += render(resource) if os.path.isdir(resource) else load(resource)
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise ValueError("%s: a patch other than {path: FILE}: %s" % (path, patch))
        for doc in load(os.path.join(directory, patch["path"])):
            targets = [o for o in objects if o["kind"] == doc["kind"]
                       and o["metadata"]["name"] == doc["metadata"]["name"]]
            if len(targets) != 1:
                raise ValueError("%s: patch %s matches %d objects"
                                 % (path, patch["path"], len(targets)))
            merge(targets[0], doc)
    if "namespace" in kustomization:
        for obj in objects:
            obj["metadata"]["namespace"] = kustomization["namespace"]
    for image in kustomization.get("images", []):
        for obj in objects:
            spec = obj.get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []) + spec.get("initContainers", []):
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = "%s:%s" % (image.get("newName", name),
                                                    image.get("newTag", tag or "latest"))
    return objects


if __name__ == "__main__":
    yaml.safe_dump_all(render(sys.argv[1]), sys.stdout, sort_keys=False)
