"""Does the CUDA fast launcher serve correct results here? One line per specialization, exit 1 if not.

    python benchmarks/fast_launch_check.py RELEASE   (the fast launcher is the CUDA default)

Loads the release (allow_unverified: it runs before tuning), calls every CUDA specialization at
its smallest and largest verification size through ``release.op(name)`` and compares with the
reference (the operator's declared tolerance); then reports which launcher served each key
(``tvm_ffi`` = the fast path, ``adapter: why`` otherwise) and any circuit the calls opened.
Where the release has the compiled dispatch table (``runtime.native``), each key is called three times
through a runner with a table of its own (the third call is the table's) and every answer is checked;
the line says how many calls the table served.
"""

from __future__ import annotations

import sys


def main(path: str) -> int:
    import torch

    from tileship.declare.inputs import verification_points
    from tileship.declare.spec import tensor_tolerance
    from tileship.runtime import native
    from tileship.runtime.loader import load

    release = load(path, allow_unverified=True)
    lib = release.snapshot / native.LIBRARY if release.snapshot else None
    module = native.load_module(lib) if lib is not None and lib.is_file() else None
    print(f"compiled dispatch table: {'loaded' if module is not None else 'none in this release'}")
    bad = checked = 0
    for name, runner in release.ops.items():
        desc = release.declarations[name]
        for entry in runner.entries:
            spec = entry.spec
            if spec is None or spec.target == "c":
                continue
            if entry.kernel is None:
                # a candidate that tuning has not chosen: not loaded by design
                if entry.decision.reason == "not_selected":
                    print(f"{spec.id}: skipped ({entry.detail})")
                    continue
                print(f"{spec.id}: NOT LOADED ({entry.decision.reason}: {entry.detail})")
                bad += 1
                continue
            checked += 1
            pts = verification_points(spec, grid=0)
            for dims in (pts[0], pts[-1]) if len(pts) > 1 else pts:
                args = runner.sample_inputs(dims, spec.dtype, "cuda", 0)
                single = type(runner)(runner.shape, runner.reference, [entry])  # this candidate only
                if module is not None and runner._table is not None:
                    single.use_native(native.NativeTable(module, single.n_inputs, 1))
                ref = runner.reference(*args)
                refs = ref if isinstance(ref, (list, tuple)) else [ref]
                ok = True
                for _ in range(3 if single._table is not None else 1):
                    out = single(*args)
                    outs = out if isinstance(out, (list, tuple)) else [out]
                    ok = ok and len(outs) == len(refs)
                    for (oname, *_), o, r in zip(desc["outputs"], outs, refs, strict=False):  # each its own tolerance
                        tol = tensor_tolerance(desc, oname, spec.dtype)
                        ok = ok and torch.allclose(o.float(), r.float(), atol=tol.atol, rtol=tol.rtol)
                table = single._table.count(0) if single._table is not None else "none"
                bad += not ok
                print(f"{spec.id} {dims}: {'ok' if ok else 'WRONG'} via {single.launchers()} table calls={table} "
                      f"faults={single.faults}")
                bad += bool(single.faults)
    if not checked:
        print("no CUDA specialization was loaded: nothing was checked")
        bad += 1
    print(f"fast launch check: {checked} specializations,", "PASS" if not bad else f"FAIL ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
