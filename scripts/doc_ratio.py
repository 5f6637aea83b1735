"""(docstring + comment) lines over code lines, per package: how much of the source is prose.

A line counts as docstring when it lies in a module's, class's or function's docstring, as
comment when a comment is all it holds; every other non-blank line is code (a line of code with a
comment at its end counts as code). Run from the checkout: `python scripts/doc_ratio.py [DIR ...]`.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

PACKAGES = ("cost_models", "planner", "runtime", "validation", "cli")


def counts(path: Path) -> tuple[int, int, int]:
    """(docstring, comment, code) lines of one file."""
    text = path.read_text()
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                doc_lines.update(range(first.lineno, first.end_lineno + 1))
    comment_lines, code_lines = set(), set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comment_lines.add(token.start[0])
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(token.start[0], token.end[0] + 1))
    code_lines -= doc_lines
    return len(doc_lines), len(comment_lines - code_lines), len(code_lines)


def main(argv: list[str]) -> int:
    for package in argv or PACKAGES:
        root = Path(package)
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
        doc = comment = code = 0
        for f in files:
            d, c, k = counts(f)
            doc, comment, code = doc + d, comment + c, code + k
        print(
            f"{package:12s} docstring {doc:6d}  comment {comment:6d}  code {code:6d}  "
            f"(docstring + comment) / code {(doc + comment) / max(code, 1):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
