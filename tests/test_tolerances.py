"""No test picks a float tolerance by hand (issue #28): a call to assert_close, allclose, isclose or approx in
tests/*.py gets its tolerance from tests/tolerance.py (or derives it, as a sampling error from a sample size), never
as a number written into the call or bound to a name on the way. tests/tolerance.py, which holds the model of
error, is the one file not read. A 0 is no tolerance (exactness is never fitted to a machine), so it may be written.
"""

import ast
import operator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CALLS = {"assert_close", "allclose", "assert_allclose", "isclose", "approx"}
TOLERANCES = {"atol", "rtol", "abs", "rel", "abs_tol", "rel_tol"}
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
ARITHMETIC |= {ast.Pow: operator.pow, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


def bindings(body):
    """{name: [value nodes]} assigned in the statements `body`, not counting nested functions and classes."""
    bound = {}
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(node.value)
        stack.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, SCOPES))
    return bound


def parameters(node):
    """{name: [default]} of the parameters of the function or lambda `node` that have a default."""
    args = node.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    return {arg.arg: [default] for arg, default in pairs}


class HandPicked(ast.NodeVisitor):
    """Finds the tolerances written as numbers, with the scopes (module, then each enclosing function) in which a
    name may have been bound to one."""

    def __init__(self, filename):
        self.filename, self.scopes, self.found = filename, [], []

    def visit_Module(self, node):
        self.scopes.append(bindings(node.body))
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        self.scopes.append(parameters(node) | bindings(node.body))
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.scopes.append(parameters(node))
        self.generic_visit(node)
        self.scopes.pop()

    def number(self, node, seen=()):
        """The value of `node` if it is a number written out, arithmetic of such, or a name bound to one; else None."""
        if isinstance(node, ast.Constant):
            value = node.value
            return value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = self.number(node.operand, seen)
            return None if value is None else (-value if isinstance(node.op, ast.USub) else value)
        if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
            left, right = self.number(node.left, seen), self.number(node.right, seen)
            if left is None or right is None:
                return None
            try:
                return ARITHMETIC[type(node.op)](left, right)
            except ArithmeticError:
                return None
        for value in self.bound(node, seen):
            number = self.number(value, (*seen, node.id))
            if number is not None:
                return number
        return None

    def bound(self, node, seen):
        """The values the name `node` is bound to in the innermost scope that binds it (none for other nodes)."""
        if not isinstance(node, ast.Name) or node.id in seen:
            return []
        return next((scope[node.id] for scope in reversed(self.scopes) if node.id in scope), [])

    def passed(self, call):
        """(keyword, value node) of each tolerance `call` is given, by keyword, by position or unpacked from a dict."""
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if name not in CALLS:
            return []
        # approx(expected, rel, abs); the others (a, b, rtol, atol)
        compared, names = (1, ("rel", "abs")) if name == "approx" else (2, ("rtol", "atol"))
        given = list(zip(names, call.args[compared:]))
        for keyword in call.keywords:
            if keyword.arg is not None:
                given.append((keyword.arg, keyword.value))
                continue
            for mapping in [keyword.value, *self.bound(keyword.value, ())]:  # **{...}, **dict(...), **name
                if isinstance(mapping, ast.Dict):
                    given += [(k.value, v) for k, v in zip(mapping.keys, mapping.values) if isinstance(k, ast.Constant)]
                elif isinstance(mapping, ast.Call) and getattr(mapping.func, "id", "") == "dict":
                    given += [(k.arg, k.value) for k in mapping.keywords if k.arg is not None]
        return [(key, value) for key, value in given if key in TOLERANCES]

    def visit_Call(self, node):
        for key, value in self.passed(node):
            number = self.number(value)
            if number is not None and number != 0:
                self.found.append(f"{self.filename}:{node.lineno}: {key}={ast.unparse(value)}")
        self.generic_visit(node)


def hand_picked(source, filename):
    """'file:line: keyword=value' for each tolerance `source` writes as a number."""
    finder = HandPicked(filename)
    finder.visit(ast.parse(source))
    return finder.found


def test_no_test_picks_a_tolerance_by_hand():
    found = [
        line
        for path in sorted(TESTS.glob("*.py"))
        if path.name != "tolerance.py"
        for line in hand_picked(path.read_text(), path.name)
    ]
    assert not found, "tolerances written as numbers; state them through tests/tolerance.py:\n" + "\n".join(found)


PLANTED = """
import math
import numpy as np
import pytest
import torch
from tolerance import assert_close

ATOL = 1e-5
CLOSE = {"rtol": 1e-4, "atol": 0}


def close(a, b, atol=1e-6):
    return torch.allclose(a, b, atol=atol)  # picked


def test_planted(a, b, n, scale):
    rel = 1e-4
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # picked
    np.testing.assert_allclose(a, b, 1e-7)  # picked
    assert a == pytest.approx(b, rel=rel)  # picked
    assert a == pytest.approx(b, abs=ATOL)  # picked
    assert math.isclose(a, b, rel_tol=-1e-3 * 2)  # picked
    assert torch.isclose(a, b, 0, 10**-5).all()  # picked
    torch.testing.assert_close(a, b, **CLOSE)  # picked
    torch.testing.assert_close(a, b, **dict(atol=1e-8))  # picked
    assert all(map(lambda x, t=1e-6: x == pytest.approx(0.0, abs=t), a))  # picked
    # Not picked by hand: exactness, defaults, derived tolerances, the helper.
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert a == pytest.approx(b) and not torch.allclose(a, b)
    assert a == pytest.approx(b, rel=5 / math.sqrt(2 * n))
    assert_close(a, b, dtype=torch.float32, terms=n, scale=scale)
"""


def test_the_check_finds_every_planted_tolerance_and_nothing_else():
    found = hand_picked(PLANTED, "planted.py")
    lines = [int(line.split(":")[1]) for line in found]
    planted = [i for i, text in enumerate(PLANTED.splitlines(), 1) if text.endswith("# picked")]
    assert sorted(lines) == planted, "\n".join(found)
    assert f"planted.py:{planted[1]}: atol=1e-05" in found  # file:line and what was passed
