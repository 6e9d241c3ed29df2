"""Where the composed config still travels: every function parameter annotated ``DictConfig``
and every module importing ``omegaconf``, per package, in one checkout or two (``--old``).

    python -m benchmarks.config_edge [--old PATH] [--list]
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path


def parameters(root: Path) -> list[str]:
    """``file:function(parameter)`` for each parameter whose annotation names ``DictConfig``."""
    found = []
    for path in sorted((root / "transformer_lab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                found += [f"{path.relative_to(root / 'transformer_lab')}:{node.name}({a.arg})"
                          for a in arguments
                          if a.annotation is not None and "DictConfig" in ast.unparse(a.annotation)]
    return found


def importers(root: Path) -> list[str]:
    """The package's modules that import ``omegaconf``."""
    return [str(p.relative_to(root / "transformer_lab"))
            for p in sorted((root / "transformer_lab").rglob("*.py"))
            if any(line.strip().startswith(("from omegaconf", "import omegaconf"))
                   for line in p.read_text(encoding="utf-8").splitlines())]


def package(place: str) -> str:
    head = place.split(":")[0]
    return head.split("/")[0] if "/" in head else "top-level"


def report(label: str, root: Path, listing: bool) -> None:
    found, modules = parameters(root), importers(root)
    by_package = Counter(package(place) for place in found)
    files = {place.split(":")[0] for place in found}
    print(f"{label}: {len(found)} DictConfig parameters in {len(files)} files "
          f"({', '.join(f'{name} {n}' for name, n in by_package.most_common())}); "
          f"omegaconf imported by {len(modules)} modules "
          f"({', '.join(f'{n} {k}' for k, n in Counter(map(package, modules)).most_common())})")
    if listing:
        print("\n".join(f"  {place}" for place in found))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="another checkout to count too")
    parser.add_argument("--list", action="store_true", help="print every parameter")
    args = parser.parse_args()
    if args.old is not None:
        report("old", args.old, args.list)
    report("this", Path(__file__).resolve().parents[1], args.list)


if __name__ == "__main__":
    main()
