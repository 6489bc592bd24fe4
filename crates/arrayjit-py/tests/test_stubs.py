"""The type stubs describe what the native module has: every public name, and every public
method of its classes (and nothing that is not there)."""

import ast
import pathlib

import arrayjit
import arrayjit._arrayjit as native

STUB = pathlib.Path(arrayjit.__file__).with_name("__init__.pyi")
NN_STUB = STUB.with_name("nn.pyi")


def stub_names(path=STUB):
    tree = ast.parse(path.read_text())
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            members = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            classes[node.name] = members
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
    return top, classes


def test_the_stub_ships_with_the_package():
    assert STUB.exists(), STUB
    assert NN_STUB.exists(), NN_STUB
    assert STUB.with_name("py.typed").exists()


def test_every_public_name_is_typed_and_exported():
    top, classes = stub_names()
    nn_top, nn_classes = stub_names(NN_STUB)
    assert nn_top == set(arrayjit.nn.__all__), "arrayjit.nn and its stub differ"
    classes.update(nn_classes)
    public = {n for n in dir(native) if not n.startswith("_")} | {"__version__"}
    assert public - top - nn_top == set(), "names without a stub"
    assert set(arrayjit.__all__) == (public - nn_top) | {"nn"}
    for cls_name, members in classes.items():
        if cls_name in ("Tensor",) and cls_name not in top:
            continue
        cls = getattr(native, cls_name, None)
        assert cls is not None, f"stub class {cls_name} is not in the module"
        if issubclass(cls, Exception):
            continue
        have = {
            n
            for n in dir(cls)
            if not n.startswith("_") or n in ("__len__", "__init__", "__call__") or n.startswith("__r")
        }
        typed = {m for m in members if not m.startswith("__") or m in have}
        missing = {
            n for n in have if not n.startswith("_") and n not in members
        }
        assert missing == set(), f"{cls_name}: methods without a stub"
        extra = {m for m in typed if not m.startswith("_") and m not in have}
        assert extra == set(), f"{cls_name}: stubbed but absent"
