"""Checking (and timing) one loaded specialization against its reference: ``verify_spec``.

For one specialization, at its verification points:

- correctness at several shapes (static: the shape; ``T.dynamic``: 1, a size that is not a
  multiple of the block, the maximum, and a geometric grid in between), each with fresh
  random inputs from several seeds (never zeros), against the reference computed in float64
  (float32 where the reference cannot run in float64; recorded). Outputs are poisoned with a
  NaN of a distinctive bit pattern before each run, so an element the kernel never wrote is
  told apart from a NaN it computed; NaN/Inf never pass; thresholds are the operator's
  declared per-dtype atol/rtol (|out - ref| <= atol + rtol * |ref| for every element),
  overridable per operator and dtype (``VerifyOptions.tolerances``);
- speed of kernel and reference as served (the kernel allocates its output): warm-up, then
  batches of back-to-back calls timed with CUDA events (perf_counter on CPU); median,
  p10/p90 and IQR per call; inputs rotated across several sets when they would fit in the
  cache; each path measured twice (kernel, reference, kernel, reference) and the difference
  between the two repeats of the same measurement is the noise band: a kernel/reference
  difference within it is "no difference".

A kernel that is wrong, or raises, is a value (``SpecVerdict.failure``, naming the shape), not an
exception; so is a reference whose answer is unlike its declaration (a NumPy array, a tuple of the wrong length,
another dtype, shape or device than declared for the call: ``runtime.answer``'s check and words, the ones a call
of the reference meets when it serves); so is what the sample hook, the kernel or the reference raised while timed
on the rotated input sets (``making timing inputs failed: ...``, ``timing failed: ...``). ``VerifyOptions`` are the
options of one verification, of a specialization here and of a whole release (``verify.verify``).

Poisoning. TileLang allocates the outputs (``out_idx``), so the poison goes where the
allocation comes from: ``torch.empty`` is swapped for the duration of one kernel call (the
Cython and Python TVM-FFI adapters allocate through it), and on CUDA the caching allocator is
handed back blocks of exactly the output sizes that hold the poison (TVM-FFI's callee-allocated
outputs come from there). Every run checks that each output really is a poisoned block (by
address; the caching allocator keeps freed contents) and fails when it cannot confirm it,
unless ``strict_poison`` is off. This swaps a global: run verification in one thread.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tileship.declare.dims import shape_at
from tileship.declare.inputs import make_inputs, point_seed, verification_points
from tileship.declare.spec import Specialization, Target, Tolerance, tensor_dtypes, tensor_tolerance
from tileship.errors import DeclarationError
from tileship.release import evidence as ev_mod
from tileship.runtime.answer import checker, declared_at
from tileship.verify.compare import Check, check_output, poisoned_call
from tileship.verify.mutated import OnClones, mutated_positions
from tileship.verify.results import PointResult, SpecVerdict
from tileship.verify.timing import NOISE_FLOOR, Timing, _stats, measure, rotation_sets


@dataclass(frozen=True)
class VerifyOptions:
    seeds: tuple[int, ...] = (0, 1, 2)
    #: cap on the sizes of a T.dynamic dim (None: up to the declared maximum)
    limit: int | None = None
    #: ratio between successive verified sizes of a T.dynamic dim (besides the edge sizes); 0: edges only
    grid: int = 4
    timing: bool = True
    warmup_ms: float = 25.0
    #: measured time per timing run (each path is timed twice)
    budget_ms: float = 100.0
    min_repeats: int = 5
    max_repeats: int = 50
    reference_dtype: str = "float64"
    #: operator -> dtype -> Tolerance, replacing the declared one
    tolerances: Mapping[str, Mapping[str, Tolerance]] = field(default_factory=dict)
    #: device types to verify ("cuda", "cpu"); specializations of others are skipped
    devices: tuple[str, ...] = ("cuda", "cpu")
    #: operator names or specialization ids to verify (empty: all)
    only: tuple[str, ...] = ()
    strict_poison: bool = True
    on_point: Callable[[str, PointResult], None] | None = None


def time_pair(kernel: Callable[..., Any], reference: Callable[..., Any], arg_sets: Sequence[Sequence[Any]],
              *, device: str, options: VerifyOptions = VerifyOptions()) -> Timing:
    """Kernel and reference, each timed twice (K, R, K, R); the repeat spread is the noise band."""
    kw = {"device": device, "warmup_ms": options.warmup_ms, "budget_ms": options.budget_ms,
          "min_repeats": options.min_repeats, "max_repeats": options.max_repeats}
    k1 = measure(kernel, arg_sets, **kw)  # type: ignore[arg-type]
    r1 = measure(reference, arg_sets, **kw)  # type: ignore[arg-type]
    k2 = measure(kernel, arg_sets, **kw)  # type: ignore[arg-type]
    r2 = measure(reference, arg_sets, **kw)  # type: ignore[arg-type]
    k = _stats(k1.samples + k2.samples, k1.repeats + k2.repeats, k1.inner, k1.sets)
    r = _stats(r1.samples + r2.samples, r1.repeats + r2.repeats, r1.inner, r1.sets)
    noise = max(abs(k1.median_us - k2.median_us), abs(r1.median_us - r2.median_us),
                NOISE_FLOOR * min(k.median_us, r.median_us))
    return Timing(k, r, noise, ev_mod.compare_times(k.median_us, r.median_us, noise),
                  {"kernel": (k1.median_us, k2.median_us), "reference": (r1.median_us, r2.median_us)})


def dynamic_block(config: Mapping[str, Any], dim: str | None) -> int:
    """The tile size along ``dim`` from an operator's config (``block_<dim>``, ``block``), else 128."""
    for key in (f"block_{dim}", "block", "block_M"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return 128


def _reference_in(reference: Callable[..., Any], args: Sequence[Any], dtype: str | None) -> list[Any]:
    """The reference on ``args`` with every float input cast to ``dtype`` (None: as declared)."""
    import torch

    up = [a.to(getattr(torch, dtype)) if dtype is not None and torch.is_tensor(a) and a.dtype.is_floating_point
          else a for a in args]
    out = reference(*up)
    return [] if out is None else list(out) if isinstance(out, (list, tuple)) else [out]


def _dt(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def held(name: str, reference: Callable[..., Any], outputs: Sequence[tuple[str, Sequence[Any]]],
         specs: Sequence[tuple[Any, Any]], args: Sequence[Any], *, dtypes: bool = True) -> Callable[..., Any]:
    """``reference`` with its answer held to the declaration as the dispatcher holds it (``runtime.answer``):
    the declared ``outputs`` (name, dims) of operator ``name``, of the (shape, torch dtype) ``specs`` at the call's
    dims (``dtypes`` False: dtypes open, for a reference run on inputs cast to float64), on the device of the
    first tensor of ``args``. The wrapped call raises DeclarationError naming the operator and the output."""
    import torch

    device = next((a.device for a in args if torch.is_tensor(a)), None)
    check = checker(name, len(outputs), declared_at(outputs, specs, dtypes=dtypes), device)

    def call(*call_args: Any) -> Any:
        return check(reference(*call_args))

    return call


def held_at(name: str, reference: Callable[..., Any], desc: Mapping[str, Any], dims: Mapping[str, int],
            args: Sequence[Any], *, dtype: str | None) -> Callable[..., Any]:
    """``held`` for operator ``name`` described by ``desc`` (its release.json entry) at ``dims``: each declared
    output's shape at ``dims`` (None, not checked, where the dims cannot tell it: a dim no input binds), and with
    ``dtype`` (the specialization's) its declared dtype; ``dtype`` None leaves the dtypes open (a reference run on
    inputs cast to float64). The one way every caller that holds a reference at a sample shape works them out
    (serve's warm-up, the demo)."""
    import torch

    outputs = [(str(n), tuple(ds)) for n, ds, *_ in desc["outputs"]]
    shapes: list[tuple[int, ...] | None] = []
    for _, ds in outputs:
        try:
            shapes.append(shape_at(ds, dims))
        except (KeyError, ValueError):
            shapes.append(None)
    dtypes = [None] * len(outputs) if dtype is None else [getattr(torch, n) for n in
                                                           tensor_dtypes(desc, "outputs", dtype)]
    return held(name, reference, outputs, list(zip(shapes, dtypes, strict=True)), args, dtypes=dtype is not None)


def verify_spec(spec: Specialization, kernel: Callable[..., Any], reference: Callable[..., Any],
                desc: Mapping[str, Any], *,
                options: VerifyOptions = VerifyOptions(), tolerance: Tolerance | None = None,
                sample: Callable[..., Any] | None = None,
                points: Sequence[Mapping[str, int]] | None = None) -> SpecVerdict:
    """Check (and time) one loaded specialization at its verification points (or at ``points``).

    Each output is poisoned, compared and sized with its own dtype; its tolerance is, in order:
    ``tolerance``, the ``options`` override for the operator dtype, the declared per-output
    override, the declared one of the operator dtype. ``sample`` (the operator's hook) makes the inputs.
    Inputs the operator updates in place (``mutates``) are compared whole after the outputs, kernel and
    reference each run on their own clones of them (``verify.mutated``); timing runs both in place."""
    import torch

    device = Target(spec.target).device_type
    inputs = [(n, tuple(ds)) for n, ds, *_ in desc["inputs"]]
    outputs = [(n, tuple(ds)) for n, ds, *_ in desc["outputs"]]
    in_dtypes = tensor_dtypes(desc, "inputs", spec.dtype)
    scalars = [i for i, (n, _) in enumerate(inputs) if n in set(desc.get("scalars") or ())]
    out_dtypes = [getattr(torch, n) for n in tensor_dtypes(desc, "outputs", spec.dtype)]
    mut = mutated_positions(desc)
    outputs += [inputs[i] for i in mut]
    out_dtypes += [getattr(torch, in_dtypes[i]) for i in mut]
    kernel_v = OnClones(kernel, mut) if mut else kernel
    declared_outputs = outputs[:len(outputs) - len(mut)]
    override = options.tolerances.get(spec.op, {}).get(spec.dtype)
    tol = tolerance or override or tensor_tolerance({k: v for k, v in desc.items() if k != "output_tolerances"},
                                                    "", spec.dtype)
    out_tols = [tolerance or override or tensor_tolerance(desc, n, spec.dtype) for n, _ in outputs]
    ref_dtype = options.reference_dtype
    if points is None:
        block = dynamic_block({**desc.get("config", {}), **dict(spec.config)}, spec.dynamic_dim)
        points = verification_points(spec, block=block, grid=options.grid, limit=options.limit)
    results: list[PointResult] = []
    for dims in points:
        checks: list[tuple[int, Check]] = []
        ref_checks: list[Check] = []
        confirmed = True
        failure = None
        first_args: list[Any] | None = None
        out_specs = [(shape_at(ds, dims), odt) for (_, ds), odt in zip(outputs, out_dtypes, strict=True)]
        out_specs = out_specs[:len(out_specs) - len(mut)]  # what the kernel allocates
        for base in options.seeds:
            seed = point_seed(base, spec.id, dims)
            try:
                args = make_inputs(inputs, dims, spec.dtype, device, seed, dtypes=in_dtypes, sample=sample,
                                   scalars=scalars)
            except Exception as exc:  # noqa: BLE001 -- the operator's sample hook failed: a verdict, not a crash
                failure = f"making inputs failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                break
            first_args = first_args or args
            try:
                outs, ok_poison = poisoned_call(kernel_v, args, out_specs, mutated=len(mut))
            except Exception as exc:  # noqa: BLE001 -- a kernel that raises fails verification; the message is the evidence
                failure = f"kernel raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                break
            confirmed = confirmed and ok_poison
            # the reference's answer held to the declaration (``runtime.answer``), as every call of it is when it
            # serves: in float64 its dtypes are open, at the declared dtypes they are held too
            as_cast, as_declared = (held(spec.op, reference, declared_outputs, out_specs, args, dtypes=d)
                                    for d in (False, True))
            if mut:
                as_cast, as_declared = OnClones(as_cast, mut), OnClones(as_declared, mut)
            try:
                native = _reference_in(as_declared, args, None)  # first: its words name the declared dtypes
                try:
                    refs = _reference_in(as_cast, args, ref_dtype)
                except (RuntimeError, NotImplementedError, TypeError):
                    if ref_dtype == "float32":
                        raise
                    ref_dtype = "float32"  # e.g. no float64 implementation on this device
                    refs = _reference_in(as_cast, args, ref_dtype)
            except DeclarationError as exc:  # a reference unlike its declaration cannot vouch for the kernel
                failure = exc.message
                break
            except Exception as exc:  # noqa: BLE001 -- a reference that raises cannot vouch for the kernel
                failure = f"reference raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                break
            if len(outs) != len(outputs) or len(refs) != len(outputs):
                failure = _count_failure(len(outs), len(refs), len(outputs), [inputs[i][0] for i in mut])
                break
            for i, (o, r, n) in enumerate(zip(outs, refs, native, strict=True)):
                t = out_tols[i]
                c = check_output(o, r, atol=t.atol, rtol=t.rtol)
                if c.failure is None and o.dtype != out_dtypes[i]:
                    c = dataclasses.replace(c, failure=f"dtype {_dt(o.dtype)}, declared {_dt(out_dtypes[i])}")
                checks.append((seed, c))
                ref_checks.append(check_output(n, r, atol=t.atol, rtol=t.rtol))
                if c.failure and failure is None:
                    failure = (f"output {outputs[i][0]}: " if len(outs) > 1 else "") + c.failure + f" (seed {seed})"
            del outs, refs, native
        if failure is None and not confirmed and options.strict_poison:
            failure = ("could not confirm the outputs were poisoned (the adapter allocated them outside the poisoned "
                       "allocator), "
                       "so unwritten elements would go unseen; use --no-strict-poison to accept")
        timing = None
        if failure is None and options.timing and first_args is not None:
            out_bytes = sum(math.prod(s) * torch.empty((), dtype=odt).element_size() for s, odt in out_specs)

            def fresh(i: int, d: Mapping[str, int] = dims) -> list[Any]:
                return make_inputs(inputs, d, spec.dtype, device, point_seed(10_000 + i, spec.id, d),
                                   dtypes=in_dtypes, sample=sample, scalars=scalars)

            made = False
            try:  # new calls of the sample hook, the kernel and the reference: what they raise fails the point
                sets = rotation_sets(first_args, fresh, device=device, out_bytes=out_bytes)
                made = True
                timing = time_pair(kernel, reference, sets, device=device, options=options)
                del sets
            except Exception as exc:  # noqa: BLE001 -- one operator's failure, not the run's (a sticky one is raised)
                failure = _timing_failed(exc, made=made)
        point = PointResult(dict(dims), tuple(checks), tuple(ref_checks), confirmed, failure, timing)
        results.append(point)
        if options.on_point:
            options.on_point(spec.id, point)
    bad = next((p for p in results if not p.passed), None)
    failure = None if bad is None else f"at {','.join(f'{k}={v}' for k, v in bad.dims.items())}: {bad.failure}"
    return SpecVerdict(spec, device, tol, override is not None, ref_dtype, tuple(results), failure)


def _timing_failed(exc: Exception, *, made: bool) -> str:
    """A point's failure when timing raised: ``making timing inputs failed: ...`` (the sample hook, on a rotated
    set: not ``made``) or ``timing failed: ...`` (the kernel or the reference, on those sets). A sticky CUDA error
    is raised (every later specialization would fail with it)."""
    from tileship.runtime.device_faults import is_sticky_cuda_error
    from tileship.verify.tune_checks import first_line

    if is_sticky_cuda_error(exc):
        raise exc
    return f"{'timing failed' if made else 'making timing inputs failed'}: {first_line(exc)}"


def _count_failure(n_kernel: int, n_reference: int, n_compared: int, mutated: list[str]) -> str:
    """Why the paths' results cannot be compared: how many outputs each returned and how many are declared, not
    counting the ``mutated`` inputs each path's results end with (``verify.mutated.OnClones``)."""
    k, r, n = n_kernel - len(mutated), n_reference - len(mutated), n_compared - len(mutated)
    said = f"the kernel returned {k} and the reference {r} outputs; {n} are declared"
    if mutated:
        said += (f" (besides {', '.join(mutated)}, updated in place"
                 + (": a reference that only updates inputs returns None)" if n == 0 else ")"))
    return said
