"""Does the CUDA fast launcher serve correct results here? One line per specialization, exit 1 if not.

    python benchmarks/fast_launch_check.py RELEASE   (the fast launcher is the CUDA default)

Loads the release (allow_unverified: it runs before tuning), calls every CUDA specialization at
its smallest and largest verification size through ``release.op(name)`` and compares with the
reference (the operator's declared tolerance); then reports which launcher served each key
(``tvm_ffi`` = the fast path, ``adapter: why`` otherwise) and any circuit the calls opened.
"""

from __future__ import annotations

import sys


def main(path: str) -> int:
    import torch

    from tileship.declare.inputs import verification_points
    from tileship.declare.spec import tensor_tolerance
    from tileship.runtime.loader import load

    release = load(path, allow_unverified=True)
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
                out = single(*args)
                ref = runner.reference(*args)
                outs = out if isinstance(out, (list, tuple)) else [out]
                refs = ref if isinstance(ref, (list, tuple)) else [ref]
                ok = len(outs) == len(refs)
                for (name, *_), o, r in zip(desc["outputs"], outs, refs, strict=False):  # each with its own tolerance
                    tol = tensor_tolerance(desc, name, spec.dtype)
                    ok = ok and torch.allclose(o.float(), r.float(), atol=tol.atol, rtol=tol.rtol)
                bad += not ok
                print(f"{spec.id} {dims}: {'ok' if ok else 'WRONG'} via {single.launchers()} faults={single.faults}")
                bad += bool(single.faults)
    if not checked:
        print("no CUDA specialization was loaded: nothing was checked")
        bad += 1
    print(f"fast launch check: {checked} specializations,", "PASS" if not bad else f"FAIL ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
