"""A small kustomize for tests/test_kubernetes.py: what `kubectl kustomize` does with the
features deploy/kubernetes/ uses (resources, namespace, images, replicas, strategic-merge
patches). test_kubernetes checks it against `kubectl kustomize` where kubectl is installed."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

# strategic merge: lists of objects merge by these keys (Kubernetes' patchMergeKey)
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",  # a container's; a Service's ports merge by "port"
}


def merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """Strategic merge: maps recursively (a null value deletes the key), lists of objects
    by their merge key, anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = merge(out[k], v, k)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        field = MERGE_KEYS[key]
        if key == "ports" and all("port" in item for item in base + patch):
            field = "port"  # a Service's (ServicePort's patchMergeKey)
        out, new = [copy.deepcopy(item) for item in base], []
        for item in patch:
            match = next((i for i, b in enumerate(out) if b.get(field) == item.get(field)), None)
            if match is None:
                new.append(copy.deepcopy(item))
            else:
                out[match] = merge(out[match], item)
        return new + out  # kustomize puts a patch's new items first
    return copy.deepcopy(patch)


def set_images(node: Any, images: list[dict[str, str]]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "image" and isinstance(v, str):
                name, _, tag = v.partition(":")
                for rule in images:
                    if rule["name"] == name:
                        new = rule.get("newName", name)
                        node[k] = (
                            f"{new}:{rule.get('newTag', tag)}" if tag or "newTag" in rule else new
                        )
            else:
                set_images(v, images)
    elif isinstance(node, list):
        for item in node:
            set_images(item, images)


def render(folder: Path) -> list[Doc]:
    """The documents `kubectl kustomize folder` prints (for the features these files use)."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    known = {"apiVersion", "kind", "namespace", "resources", "images", "replicas", "patches"}
    assert set(spec) <= known, f"render() does not know {set(spec) - known}"
    docs: list[Doc] = []
    for resource in spec.get("resources", []):
        path = folder / resource
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for entry in spec.get("patches", []):
        patch = yaml.safe_load((folder / entry["path"]).read_text())
        target = [
            i
            for i, d in enumerate(docs)
            if d["kind"] == patch["kind"] and d["metadata"]["name"] == patch["metadata"]["name"]
        ]
        assert len(target) == 1, f"{entry['path']} patches {len(target)} documents"
        docs[target[0]] = merge(docs[target[0]], patch)
    for rule in spec.get("replicas", []):
        for d in docs:
            if d["metadata"]["name"] == rule["name"] and "replicas" in d.get("spec", {}):
                d["spec"]["replicas"] = rule["count"]
    set_images(docs, spec.get("images", []))
    if "namespace" in spec:
        for d in docs:
            d["metadata"]["namespace"] = spec["namespace"]
    return docs


def by_kind(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}
