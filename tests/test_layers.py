"""The package's layers: no import cycle between its subpackages, the data plane below the control
plane, and what a user's `import` and `connect()` load."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "scopecast"
# each subpackage may import only from those listed after it here (and from itself)
LAYERS = ["ray_cluster", "scopes", "agents", "policies", "netio", "actors"]


def _imports(path: Path) -> set[str]:
    """The scopecast modules a file imports, wherever in the file (functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("scopecast.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.startswith("scopecast"):
            if node.module == "scopecast":
                out |= {f"scopecast.{a.name}" for a in node.names}
            else:
                out.add(node.module)
    return out


def subpackage_graph() -> dict[str, set[str]]:
    """subpackage -> the other subpackages its modules import."""
    graph: dict[str, set[str]] = {}
    for sub in (p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        edges = graph.setdefault(sub.name, set())
        for path in sub.rglob("*.py"):
            for module in _imports(path):
                parts = module.split(".")
                if len(parts) > 1 and parts[1] != sub.name and (PACKAGE / parts[1]).is_dir():
                    edges.add(parts[1])
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_finds_a_cycle_and_accepts_a_dag():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_subpackages():
    graph = subpackage_graph()
    assert set(LAYERS) <= set(graph)
    assert cycle(graph) is None, f"import cycle: {' -> '.join(cycle(graph))}"


@pytest.mark.parametrize("sub", LAYERS)
def test_each_subpackage_imports_only_layers_below_it(sub):
    below = set(LAYERS[LAYERS.index(sub) + 1:])
    assert subpackage_graph()[sub] <= below, f"{sub} imports {subpackage_graph()[sub] - below}"


def _benchmark_imports(nodes) -> list[str]:
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return [n for n in names if n.split(".")[0] == "benchmarks"]


def test_the_library_never_imports_the_benchmarks_and_the_cli_only_for_bench():
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        if path.name == "cli.py":  # `scopecast bench` loads them when it runs, nothing else does
            outside = [n for n in tree.body if not isinstance(n, ast.FunctionDef)]
            bench = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cmd_bench")
            others = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n is not bench]
            assert not _benchmark_imports(ast.walk(ast.Module(outside + others, []))), path
            assert _benchmark_imports(ast.walk(bench))  # (the check above looks at the right file)
        else:
            assert not _benchmark_imports(ast.walk(tree)), f"{path} imports benchmarks"


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\n"
                          "print(json.dumps(sorted(m for m in sys.modules if m.startswith("
                          "('scopecast', 'benchmarks', 'ray.autoscaler.v2.utils')))))"],
                         capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_importing_the_data_plane_loads_no_control_plane():
    loaded = _loaded_after("import scopecast.netio.runtime, scopecast.netio.pubsub")
    assert "scopecast.netio.runtime" in loaded
    control = {m for m in loaded if m.split(".")[1:2] and m.split(".")[1] in
               ("scopes", "agents", "policies", "ray_cluster")}
    assert not control, control


def test_connect_loads_neither_the_local_hosts_tooling_nor_the_benchmarks(ray_address):
    loaded = _loaded_after(f"import scopecast\nc = scopecast.connect(address={ray_address!r})\n"
                           "c.shutdown()")
    assert "scopecast.ray_cluster.cluster" in loaded
    assert "scopecast.ray_cluster.local_hosts" not in loaded
    assert not any(m.startswith("benchmarks") for m in loaded)
    # what Ray's log thread would import mid-stream at the autoscaler's first event line, also
    # in a driver that called ray.init itself
    assert "ray.autoscaler.v2.utils" in loaded
    assert "ray.autoscaler.v2.utils" in _loaded_after(
        f"import ray, scopecast\nray.init(address={ray_address!r}, namespace='scopecast')\n"
        "c = scopecast.connect()\nc.shutdown()")


def test_a_driver_finds_its_own_hosts_ray_node_in_the_map_the_local_hosts_tooling_passes_down():
    """Without scanning processes: the map names each host's network namespace (inode) and node
    address; a process inherits it into whichever host it is started in and looks itself up."""
    from scopecast.ray_cluster.cluster import NODE_IPS_ENV, namespace_node_ip

    mine = os.readlink("/proc/self/ns/net").partition("[")[2].rstrip("]")
    assert namespace_node_ip({NODE_IPS_ENV: f"1=10.0.0.1,{mine}=10.9.9.9"}) == "10.9.9.9"
    assert namespace_node_ip({NODE_IPS_ENV: "1=10.0.0.1"}) is None  # not a host of it
    assert namespace_node_ip({}) is None


MAX_LINES = 600


def test_no_module_is_longer_than_a_newcomer_can_read():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


# private attributes of other libraries' objects that scopecast uses knowingly
FOREIGN_PRIVATES = {"_exit",                                          # os._exit
                    "_jvm", "_jsparkSession", "_serialize_to_jvm",    # PySpark's JVM bridge
                    "_private", "_global_node",                       # Ray's node, in launch
                    "_internal_kv_get", "_internal_kv_put", "_internal_kv_del",  # Ray's GCS
                    "_internal_kv_list", "_internal_kv_initialized",  # store, in ray_private
                    "_actor_id",                                      # a Ray actor handle's id
                    "_current_frames"}                                # sys's, in thread_stack


def _defined_here(tree: ast.AST) -> set[str]:
    """Names a module defines for its own objects: functions, classes, attributes it assigns on
    any object, and __slots__ entries."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "__slots__" \
                        and isinstance(node.value, ast.Tuple):
                    names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return names


def test_no_part_touches_another_parts_private_attributes():
    """Parts reach each other through what they declare public: `obj._name` is read or written
    only on `self`, `cls`, `super()`, or on objects of the module that defines `_name`."""
    touched = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        own = _defined_here(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            on = node.value
            if isinstance(on, ast.Name) and on.id in ("self", "cls") or \
                    isinstance(on, ast.Call) and getattr(on.func, "id", "") == "super":
                continue
            if node.attr not in own and node.attr not in FOREIGN_PRIVATES:
                touched.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}")
    assert touched == []


# the member runtime's parts, and the interface (a Protocol in netio/member_parts.py) through
# which the others reach each
RUNTIME_PARTS = {"netio/receive_path.py": "ReceivePath", "netio/send_path.py": "SendPath",
                 "netio/recovery_path.py": "RecoveryPath", "netio/reorder_buffer.py": "ReorderBuffer",
                 "netio/channel_acks.py": "ChannelAcks", "netio/joins.py": "Joins",
                 "netio/own_stream.py": "OwnStream", "netio/delivery.py": "Delivery",
                 "netio/repair_server.py": "MemberRepairs"}
PART_INTERFACES = {"receiver": "Receiving", "sender": "Sending", "recovery": "Recovering",
                   "_receiver": "Receiving", "_sender": "Sending", "_recovery": "Recovering"}


def _declared(tree: ast.AST, cls: str) -> set[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)} \
                | {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    raise AssertionError(f"no class {cls}")


def _undeclared_uses(part: ast.ClassDef, declared: dict[str, set[str]]) -> list[ast.Attribute]:
    """`self.<part>.<name>` in `part` where `name` is not declared on that part's interface."""
    return [node for node in ast.walk(part)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"
            and node.value.attr in declared and node.attr not in declared[node.value.attr]]


def _interfaces() -> dict[str, set[str]]:
    tree = ast.parse((PACKAGE / "netio/member_parts.py").read_text())
    return {ref: _declared(tree, cls) for ref, cls in PART_INTERFACES.items()}


def test_the_runtime_parts_are_composed_and_reach_each_other_only_through_their_interfaces():
    """The member runtime is composed of parts, not mixins, and a part uses of another only
    what that part's interface in `member_parts` declares (`self.sender.x` needs `x` on
    `Sending`)."""
    declared = _interfaces()
    runtime = ast.parse((PACKAGE / "netio/runtime.py").read_text())
    (cls,) = [n for n in runtime.body if isinstance(n, ast.ClassDef) and n.name == "MemberRuntime"]
    assert cls.bases == []  # composed, not inherited
    undeclared = []
    for module, name in RUNTIME_PARTS.items():
        tree = ast.parse((PACKAGE / module).read_text())
        (part,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
        assert part.bases == [], f"{name} inherits"
        undeclared += [f"{module}:{n.lineno} {ast.unparse(n)}"
                       for n in _undeclared_uses(part, declared)]
    assert undeclared == []


def test_the_interface_check_finds_a_part_reaching_past_an_interface():
    source = ("class P:\n    def f(self):\n        self.sender.on_ack(1, 2, 3, 0.0)\n"
              "        self.sender._pump()\n        return self.recovery.hole_opened\n")
    (part,) = ast.parse(source).body
    assert [ast.unparse(n) for n in _undeclared_uses(part, _interfaces())] == ["self.sender._pump"]
