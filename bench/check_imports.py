#!/usr/bin/env python3
"""Checks bench/bench_lib's modules: no import cycle among them, and each imports alone in a fresh interpreter.

Usage: check_imports.py VENV_PYTHON

The cycle check reads every import statement of every module, those inside functions too: an import deferred into
a function hides a cycle until that function runs, which is when a benchmark is hours in. It needs only this
interpreter. The import of each module alone needs the project's .venv (the modules import numpy, torch, ... at
the top); without it the test is a skip (exit 77) once the cycle check has passed.
"""
import ast
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "bench_lib"
SKIP = 77


def modules():
    folder = os.path.join(HERE, PACKAGE)
    return sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py"))


def imported_siblings(name, siblings):
    """The bench_lib modules `name` imports, relatively (from . import x, from .x import y) or by their bare name
    (the runner scripts put bench_lib/ on sys.path and `import ref_runner`)."""
    with open(os.path.join(HERE, PACKAGE, name + ".py"), encoding="utf-8") as f:
        tree = ast.parse(f.read(), name + ".py")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(a.name for a in node.names)
            elif node.level == 0 and node.module:
                parts = node.module.split(".")
                if parts[0] == PACKAGE and len(parts) > 1:
                    found.add(parts[1])
                elif parts[0] == PACKAGE:
                    found.update(a.name for a in node.names)
                else:
                    found.add(parts[0])
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                found.add(parts[1] if parts[0] == PACKAGE and len(parts) > 1 else parts[0])
    return sorted((found & set(siblings)) - {name, "__init__"})


def find_cycle(graph):
    state = {}
    stack = []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in graph[n]:
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state:
                cycle = visit(m)
                if cycle:
                    return cycle
        stack.pop()
        state[n] = "done"
        return None

    for n in graph:
        if n not in state:
            cycle = visit(n)
            if cycle:
                return cycle
    return None


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    names = modules()
    graph = {n: imported_siblings(n, names) for n in names}
    cycle = find_cycle(graph)
    if cycle:
        print("import cycle in bench/bench_lib: " + " -> ".join(cycle), file=sys.stderr)
        return 1
    print(f"no import cycle among {len(names)} bench_lib modules")

    python = sys.argv[1]
    if not os.access(python, os.X_OK):
        print(f"SKIP: {python} not found (tools/setup creates the .venv): modules not imported", file=sys.stderr)
        return SKIP
    env = dict(os.environ, PYTHONPATH=HERE, PYTHONDONTWRITEBYTECODE="1")
    failed = 0
    for n in names:
        module = PACKAGE if n == "__init__" else f"{PACKAGE}.{n}"
        p = subprocess.run([python, "-c", f"import {module}"], env=env, capture_output=True, text=True, cwd=HERE)
        if p.returncode != 0:
            failed += 1
            print(f"import {module} failed:\n{p.stderr[-2000:]}", file=sys.stderr)
        else:
            print(f"import {module}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
