"""No import cycles inside the onnxjob package, the imports deferred into functions
included (docs/design.md, "Layers"). A deferred import that only hides a cycle from Python
still ties the two modules together: each needs the other.

The graph: one node per module (a package's `__init__.py` is the package's node); an edge
for every `import` and `from ... import` anywhere in a module (module level, functions,
classes), relative ones resolved; `from package import name` is an edge to the submodule
`package.name` where that is a module, else to the package. Importing a submodule is not
counted as an import of the packages above it (Python runs their `__init__` first, but the
submodule needs none of their names). So `onnxjob/__init__.py`, the `flow` namespace, is the
top layer: a module that imports the namespace itself (`import onnxjob as flow`, `from
onnxjob import global_function`) closes a cycle through it and fails here."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "onnxjob"


def module_files():
    """{module name: path} of every module of the package."""
    modules = {}
    for folder, dirs, files in os.walk(os.path.join(ROOT, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in files:
            if not name.endswith(".py"):
                continue
            parts = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = os.path.join(folder, name)
    return modules


def packages(modules):
    """The package names: every folder that holds a module (with or without __init__)."""
    return {name.rsplit(".", 1)[0] for name in modules if "." in name} | \
        {name for name, path in modules.items() if path.endswith("__init__.py")}


def imports_of(name, path, modules, package_names):
    """{imported module: line of its first import} for the package's modules that
    module `name` (at `path`) imports anywhere in its code."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    here = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = {}

    def add(target, line):
        # a package without an __init__ has no code: the import depends on nothing there
        while target and target not in modules and target not in package_names:
            target = target.rpartition(".")[0]
        if target in modules and target != name:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules or submodule in package_names:
                    add(submodule, node.lineno)
                else:
                    add(source, node.lineno)
    return found


def import_graph():
    """{module: {imported module: line}} over the whole package."""
    modules = module_files()
    package_names = packages(modules)
    return {name: imports_of(name, path, modules, package_names)
            for name, path in modules.items()}


def strongly_connected(graph):
    """The strongly connected components of `graph` with more than one module
    (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = counter[0]
                    counter[0] += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def describe(component, graph):
    """The imports that tie the modules of a component together, one a line."""
    members = set(component)
    return "\n".join(f"  {source} -> {target} (line {line})"
                     for source in component
                     for target, line in sorted(graph[source].items()) if target in members)


def test_the_graph_sees_deferred_relative_and_submodule_imports():
    graph = import_graph()
    # inside a function; `from package import submodule`; a package's own __init__
    assert "onnxjob.runtime.backend" in graph["onnxjob.frontend.ranks"]
    assert "onnxjob.settings" in graph["onnxjob.graph.pass_cache"]
    assert "onnxjob.passes" in graph["onnxjob.graph.pass_cache"]
    # relative, from a package's __init__ and from a submodule
    assert "onnxjob.passes.default_pipeline" in graph["onnxjob.passes"]
    assert "onnxjob.passes._util" in graph["onnxjob.passes.fold_reshapes"]
    # the namespace itself (`import onnxjob as flow`), from above it
    assert "onnxjob" in graph["onnxjob.__main__"]


def test_a_cycle_is_found_and_named():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}, "e": {"e": 5}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert describe(["a", "b", "c"], graph).splitlines() == [
        "  a -> b (line 1)", "  b -> c (line 2)", "  c -> a (line 3)"]


def test_no_import_cycles_in_the_package():
    graph = import_graph()
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles (move the shared code down a layer, docs/design.md):\n" + \
        "\n".join(f"{len(c)} modules: {', '.join(c)}\n{describe(c, graph)}" for c in cycles)
