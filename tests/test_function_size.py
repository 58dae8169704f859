"""Every function and method of the package is short: at most 60 lines and 8 parameters; and every class at most
220 lines, so that length pushed out of functions does not gather in a class that owns too much.

Lines count from the `def` line to the function's last line, docstring included. Parameters count
every name a caller can pass (`self` and `cls` of a method not counted; `*args` and `**kwargs` one
each). A function may be longer, or take more, where its docstring says why in a sentence that
begins "Why so long:" or "Why so many parameters:".
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "mixit"
MAX_LINES = 60
MAX_PARAMS = 8
MAX_CLASS_LINES = 220


def functions(tree: ast.AST):
    """Every function of `tree` (nested ones too), each with whether it is defined in a class body."""
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield child, isinstance(node, ast.ClassDef)


def n_params(function: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    args = function.args
    names = [a.arg for a in args.posonlyargs + args.args]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
    if method and not static and names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + len(args.kwonlyargs) + (args.vararg is not None) + (args.kwarg is not None)


def offenders() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for function, method in functions(ast.parse(path.read_text())):
            doc = ast.get_docstring(function) or ""
            where = f"{path.relative_to(SRC.parent)}:{function.lineno} {function.name}"
            lines = function.end_lineno - function.lineno + 1
            if lines > MAX_LINES and "Why so long:" not in doc:
                found.append(f"{where}: {lines} lines (at most {MAX_LINES})")
            params = n_params(function, method)
            if params > MAX_PARAMS and "Why so many parameters:" not in doc:
                found.append(f"{where}: {params} parameters (at most {MAX_PARAMS})")
    return found


def test_functions_are_short_and_take_few_parameters():
    found = offenders()
    assert not found, f"{len(found)} functions too long or taking too many parameters:\n" + "\n".join(found)


def test_classes_are_short():
    found = [
        f"{path.relative_to(SRC.parent)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for path in sorted(SRC.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    ]
    assert not found, f"classes over {MAX_CLASS_LINES} lines:\n" + "\n".join(found)


def test_the_counts_by_hand():
    source = (
        '''
class A:
    def method(self, a, b, *rest, c, **more):
        pass

    @staticmethod
    def static(self, a):
        pass

def long(a):
    """Why so many parameters: none; but no reason for its length."""
'''
        + "    x = 1\n" * 60
    )
    found = {function.name: (function, method) for function, method in functions(ast.parse(source))}
    (method, in_class), (static, _), (long, top) = found["method"], found["static"], found["long"]
    assert in_class and not top
    assert n_params(method, True) == 5  # a, b, *rest, c, **more
    assert n_params(static, True) == 2  # a static method's first parameter is not self
    assert long.end_lineno - long.lineno + 1 == 62
