"""Run in a fresh interpreter by ``test_nojit_guard``: install the no-JIT guard before or after
TileLang is imported, import every guarded module, and call every guarded entry point and alias.

``cuda-python`` is not installed on the CPU test host, so stand-in ``cuda.bindings`` modules are
registered first: TileLang's NVRTC modules then import and their compile functions can be checked.
Prints one JSON line: {"unavailable", "not_raising", "attempts"}.
"""

import importlib
import json
import sys
import types


class _Stub(types.ModuleType):
    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})


def stub_cuda_python() -> None:
    for name in ("cuda", "cuda.bindings", "cuda.bindings.driver", "cuda.bindings.nvrtc", "cuda.bindings.runtime"):
        mod = _Stub(name)
        mod.__path__ = []
        sys.modules[name] = mod
    sys.modules["cuda"].bindings = sys.modules["cuda.bindings"]
    for leaf in ("driver", "nvrtc", "runtime"):
        setattr(sys.modules["cuda.bindings"], leaf, sys.modules[f"cuda.bindings.{leaf}"])


def resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    for attr in parts[i:]:
        obj = getattr(obj, attr)
    return obj


def main(order: str, aliases: list[str]) -> None:
    from tileship.errors import CompileForbidden
    from tileship.runtime import nojit

    stub_cuda_python()
    if order == "before":
        import tilelang  # noqa: F401
    nojit.install()
    if order == "after":
        assert "tilelang" not in sys.modules, "install() imported TileLang"
    unavailable = nojit.import_all()
    not_raising = []
    for dotted in [f"{m}.{a}" for m, a in nojit.GUARDED] + aliases:
        try:
            resolve(dotted)(None)  # type: ignore[operator]
            not_raising.append(f"{dotted}: returned")
        except CompileForbidden:
            pass
        except Exception as exc:
            not_raising.append(f"{dotted}: {type(exc).__name__}: {exc}"[:200])
    print(json.dumps({"unavailable": unavailable, "not_raising": not_raising, "attempts": nojit.attempts()}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
