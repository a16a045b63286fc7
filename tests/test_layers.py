"""The package's import graph, read statically from the source (imports inside functions count too): no circles,
and arrows only downward through the layers cli -> commands -> search -> {training, data, storage, analysis}
-> config. A new module must be given its layer here."""

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "ilr_search"

LAYERS = {  # a top-level module or folder of the package -> its layer; higher imports lower (or its own layer)
    "config": 0,
    "options": 0,  # the commands' settings (each field an option)
    "errors": 0,
    "interrupts": 0,
    "records": 0,
    "knobs": 0,
    "space": 0,
    "folders": 0,  # settings, errors and records
    "time_budget": 0,  # run --time-budget: the duration text and the one clock a deadline reads
    "training": 1,
    "data": 1,
    "storage": 1,
    "analysis": 1,
    "search": 2,
    "commands": 3,  # the use cases under the CLI
    "cli": 4,
    "__main__": 4,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    candidate = f"{target}.{alias.name}"
                    deps.add(candidate if candidate in modules else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    if top == "__init__":
        return 0
    assert top in LAYERS, f"{module} has no layer: add it to tests/test_layers.py LAYERS"
    return LAYERS[top]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert "ilr_search.commands.run" in graph["ilr_search.cli.main"]
    assert "ilr_search.training.model" in graph["ilr_search.training.train"]
    assert "ilr_search.data.tokenizers" in graph["ilr_search.data.tokens"]


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_imports_point_down_the_layers_only():
    upward = [
        (m, d)
        for m, deps in import_graph().items()
        for d in deps
        if not m.endswith("__init__") and layer_of(d) > layer_of(m)
    ]
    assert upward == []


def test_only_the_settings_layer_sits_at_the_top_of_the_package():
    """Every other module lives in the folder of its layer (training/, data/, storage/, analysis/, search/,
    commands/, cli/), so the layout shows the layers."""
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert top == {name for name, layer in LAYERS.items() if layer == 0}
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == {
        name for name, layer in LAYERS.items() if layer > 0 and name != "__main__"
    }


def test_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


CLI_MAY_IMPORT = (
    "ilr_search.commands",
    "ilr_search.config",
    "ilr_search.options",
    "ilr_search.errors",
    "ilr_search.interrupts",
    "ilr_search.cli",
)


def test_the_cli_imports_only_the_commands_settings_errors_and_itself():
    """cli/ parses and renders: what it needs of the package (use cases, the events it draws, how a map is written)
    comes through commands/, besides the settings (config, options) and errors. The package's own names (its
    __version__, no module) are allowed too."""
    graph = import_graph()
    cli = {m: deps for m, deps in graph.items() if m == "ilr_search.cli" or m.startswith("ilr_search.cli.")}
    assert {"ilr_search.cli.main", "ilr_search.cli.ui"} <= set(cli)
    assert "ilr_search.commands.run" in cli["ilr_search.cli.main"]  # an import inside a function is read too

    def allowed(dep: str) -> bool:
        return dep == "ilr_search" or any(dep == ok or dep.startswith(ok + ".") for ok in CLI_MAY_IMPORT)

    assert [(m, d) for m, deps in sorted(cli.items()) for d in sorted(deps) if not allowed(d)] == []
