"""Where src/mixit's lines are: docstrings, comments, blank lines and code, per part of the tree (issue 41).

    python docs/results/source-lines/count.py > docs/results/source-lines/counts-<commit>.txt

A docstring is a module's, class's or function's first string, or a string right after an assignment in a module or
class body (an attribute's docstring, which --help shows). Blank lines inside a docstring count as docstring. Lines
are Python's `splitlines`, which counts a last line without a newline that `wc -l` does not.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3] / "src" / "mixit"
PARTS = ("core", "study", "analysis")


def docstring_lines(tree: ast.Module) -> set[int]:
    found: set[int] = set()

    def mark(node: ast.stmt) -> None:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            mark(node.body[0])
        if isinstance(node, (ast.Module, ast.ClassDef)):
            for before, after in zip(node.body, node.body[1:]):
                if isinstance(before, (ast.Assign, ast.AnnAssign)):
                    mark(after)
    return found


def main() -> None:
    totals: dict[str, list[int]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        lines = path.read_text().splitlines()
        docs = docstring_lines(ast.parse("\n".join(lines)))
        rest = [line.strip() for number, line in enumerate(lines, 1) if number not in docs]
        comments = sum(line.startswith("#") for line in rest)
        blank = sum(not line for line in rest)
        top = path.relative_to(ROOT).parts[0]
        part = top if top in PARTS else "tooling and base"
        for key in (part, "all"):
            row = totals.setdefault(key, [0, 0, 0, 0])
            for i, value in enumerate((len(lines), len(docs), comments, blank)):
                row[i] += value
    print("| part | lines | docstrings | comments | blank | code |")
    print("|---|---|---|---|---|---|")
    for part in (*PARTS, "tooling and base", "all"):
        lines, docs, comments, blank = totals[part]
        print(f"| {part} | {lines} | {docs} | {comments} | {blank} | {lines - docs - comments - blank} |")


if __name__ == "__main__":
    main()
