"""The package's imports, read statically (ast): no import circles in model/, service/ and
clients/, the model's layers import only layers below them (model/__init__.py lists them),
service/'s faces stand on its engine and not on each other (service/__init__.py), and the
one-way boundaries (the model knows nothing of the service or the clients; the
clients speak only the proto).

Every import counts, also those inside functions and under TYPE_CHECKING: a circle through
a deferred import is still a circle to whoever reads the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"model": "xattn.model", "service": "xattn.service", "clients": "xattn.clients"}
# model/'s layers, lowest first; a module at the top of model/ (pipeline, __main__) is above all
LAYERS = ("audio", "net", "checkpoints", "decode", "transcribe", "live")
# service/: the engine at the bottom, the faces above it (none imports another), the process
# (modules at the top of service/) above all
SERVICE_ENGINE = "engine"
SERVICE_FACES = ("grpc", "http", "wyoming")


def modules(root: Path = ROOT, folders: dict[str, str] = FOLDERS) -> dict[str, Path]:
    """Module name -> file, for every .py file under the folders."""
    found = {}
    for folder, package in folders.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` (at `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from package import module` imports the module; `from module import name` the module
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph(root: Path = ROOT, folders: dict[str, str] = FOLDERS) -> dict[str, set[str]]:
    found = modules(root, folders)
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan), each
    as the path a -> b -> ... -> a."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # recursive: the package has a few hundred modules at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [_circle(c, edges) for c in components]


def _circle(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside it."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & component):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle in {component}")  # a component of >1 always has one


def layer(module: str) -> int | None:
    """The rank of a module of xattn.model in LAYERS (len(LAYERS) for the top), else None."""
    parts = module.split(".")
    if parts[:2] != ["xattn", "model"]:
        return None
    if len(parts) > 2 and parts[2] in LAYERS and (len(parts) > 3 or _is_package(parts[2])):
        return LAYERS.index(parts[2])
    return len(LAYERS)


def _is_package(name: str) -> bool:
    return (ROOT / "model" / name / "__init__.py").is_file()


def test_no_import_circles() -> None:
    found = cycles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_model_layers_import_only_lower_layers() -> None:
    wrong = []
    for module, targets in graph().items():
        rank = layer(module)
        if rank is None:
            continue
        for target in sorted(targets):
            other = layer(target)
            if other is not None and other > rank:
                wrong.append(f"{module} ({_name(rank)}) imports {target} ({_name(other)})")
    assert not wrong, "upward imports in model/:\n" + "\n".join(wrong)


def _name(rank: int) -> str:
    return LAYERS[rank] if rank < len(LAYERS) else "top"


def service_room(module: str) -> str | None:
    """The room of a module of xattn.service: "engine", a face's name or "top"; else None."""
    parts = module.split(".")
    if parts[:2] != ["xattn", "service"]:
        return None
    if len(parts) > 2 and parts[2] in (SERVICE_ENGINE, *SERVICE_FACES):
        if len(parts) > 3 or (ROOT / "service" / parts[2] / "__init__.py").is_file():
            return parts[2]
    return "top"


def service_import_allowed(source: str, target: str) -> bool:
    """The engine imports only the engine; a face the engine and itself; the top anything."""
    if source == "top":
        return True
    if source == SERVICE_ENGINE:
        return target == SERVICE_ENGINE
    return target in (SERVICE_ENGINE, source)


def test_service_faces_stand_on_the_engine() -> None:
    wrong = [
        f"{module} ({service_room(module)}) imports {target} ({service_room(target)})"
        for module, targets in graph().items()
        if service_room(module) is not None
        for target in sorted(targets)
        if service_room(target) is not None
        and not service_import_allowed(service_room(module), service_room(target))
    ]
    assert not wrong, "service/ imports against its rooms:\n" + "\n".join(wrong)


def test_service_rooms_rule() -> None:
    """The rule itself: a face importing another face, or the engine a face, is refused."""
    assert service_room("xattn.service.engine.live") == "engine"
    assert service_room("xattn.service.http.app") == "http"
    assert service_room("xattn.service.server") == "top"
    assert service_room("xattn.model.pipeline") is None
    assert not service_import_allowed("http", "grpc")
    assert not service_import_allowed("engine", "http")
    assert not service_import_allowed("grpc", "top")
    assert service_import_allowed("http", "engine") and service_import_allowed("top", "http")


def test_one_way_boundaries() -> None:
    """model/ imports neither the service nor the clients, service/ not the clients, and
    clients/ neither the model nor the service (they speak only the proto, xattn.v1)."""
    forbidden = {
        "xattn.model": ("xattn.service", "xattn.clients"),
        "xattn.service": ("xattn.clients",),
        "xattn.clients": ("xattn.model", "xattn.service"),
    }
    wrong = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in sorted(targets)
        for prefix in forbidden[".".join(module.split(".")[:2])]
        if target == prefix or target.startswith(prefix + ".")
    ]
    assert not wrong, "\n".join(wrong)


def test_a_circle_is_found_and_named(tmp_path: Path) -> None:
    """The walk itself: a circle through a deferred `from package import module` is found."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from xattn.pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from xattn.pkg import c\n")
    (pkg / "c.py").write_text("import xattn.pkg.a as a\n")
    (pkg / "d.py").write_text("from . import a\nfrom .sub.b import f\n")
    edges = graph(tmp_path, {"pkg": "xattn.pkg"})
    assert edges["xattn.pkg.d"] == {"xattn.pkg.a", "xattn.pkg.sub.b"}
    assert cycles(edges) == [["xattn.pkg.a", "xattn.pkg.sub.b", "xattn.pkg.c", "xattn.pkg.a"]]
