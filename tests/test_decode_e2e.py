"""benchmarks/decode_e2e.py on a CPU with a tiny config: the KV cache is right (decode == a
no-cache recompute, per-row lengths), the W4A16 packing and its reference, the custom-op route
through a release, and the JSON layout the GPU run is read by."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _load() -> Any:
    name = "decode_e2e_bench"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "decode_e2e.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


de = _load()
TINY = de.Config(hidden=256, layers=2, n_heads=4, n_kv_heads=2, head_dim=64, intermediate=512, vocab=512)
TINY_FLAGS = ["--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--head-dim", "64",
              "--intermediate", "512", "--vocab", "512"]
B, CAP, ROOM = 2, 64, 16
PLEN = CAP - ROOM


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add contention on a loaded CI machine
    yield
    torch.set_num_threads(before)


def _weights(dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    return de.random_weights(TINY, dtype, "cpu", seed=0)


def _prompt(n: int = PLEN) -> torch.Tensor:
    return torch.randint(0, TINY.vocab, (B, n), generator=torch.Generator().manual_seed(1))


def _recompute(p: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Last-position logits of ``tokens`` [b, n] from scratch: a fresh cache and one causal forward."""
    st = de.new_state(TINY, tokens.shape[0], tokens.shape[1], TINY.layers, p.weights["embed"].dtype, "cpu")
    return de.prefill(p, TINY, st, tokens)


@torch.inference_mode()
def test_decode_with_the_cache_matches_a_no_cache_recompute_per_row_length():
    p = de.make_path("torch_fp16", TINY, _weights())
    prompt = _prompt()
    short = PLEN - 5  # row 1's prompt is 5 tokens shorter: per-row positions, masking and writes
    st = de.new_state(TINY, B, CAP, TINY.layers, torch.float32, "cpu")
    de.prefill(p, TINY, st, prompt)
    st.tokens[1] = _recompute(p, prompt[1:2, :short]).argmax(-1)[0]
    st.lengths[1] = short
    seqs = [prompt[0].tolist() + [int(st.tokens[0])], prompt[1, :short].tolist() + [int(st.tokens[1])]]
    stepper = de.make_stepper(p, TINY, st, compiled=False)
    steps = 12
    for i in range(steps):
        logits = stepper.step()
        for r in range(B):
            want = _recompute(p, torch.tensor([seqs[r]]))
            assert de.rel_l2(logits[r : r + 1], want) < 1e-4, (i, r)
            assert int(st.tokens[r]) == int(want.argmax(-1)[0]), (i, r)
            seqs[r].append(int(st.tokens[r]))
    assert st.lengths.tolist() == [PLEN + steps, short + steps]
    assert st.lengths.dtype == torch.int32
    # nothing written past each row's length: the cache write is a per-row scatter, not a slice
    for layer in range(TINY.layers):
        assert not st.k[layer][0, PLEN + steps :].any() and not st.v[layer][0, PLEN + steps :].any()


def test_w4a16_fallback_packing_round_trip_and_nibble_layout():
    w = torch.randn(16, 256, dtype=torch.float16) * 0.02
    w[3, :128] = 0  # an all-zero group
    qw, s = de.quantize_fallback(w)
    assert qw.dtype == torch.int32 and qw.shape == (16, 32) and s.shape == (16, 2) and s.dtype == torch.float16
    back = de.dequantize_fallback(qw, s)
    assert back.dtype == torch.float16 and back.shape == w.shape
    bound = s.float().repeat_interleave(128, dim=1) / 2 * 1.01 + 1e-6
    assert ((back.float() - w.float()).abs() <= bound).all()
    assert not back[3, :128].any()
    # nibble j of each int32 holds element (0,2,4,6,1,3,5,7)[j] of its group of 8, as round(w/s) + 8
    q = (
        (torch.round(w.float() / s.float().clamp_min(1e-30).repeat_interleave(128, dim=1)) + 8)
        .clamp(0, 15)
        .to(torch.int64)
    )
    q[3, :128] = 8
    for j, e in enumerate((0, 2, 4, 6, 1, 3, 5, 7)):
        assert torch.equal((qw.to(torch.int64) >> (4 * j)) & 0xF, q.view(16, 32, 8)[..., e]), j


@torch.inference_mode()
def test_w4a16_path_is_the_int4_model_and_close_to_fp16_within_the_int4_error():
    weights = _weights()
    quantize, dequantize, _ = de.packing()
    quantized = de.quantize_weights(weights, quantize)
    ref = de.make_path("torch_fp16", TINY, weights)
    w4 = de.w4a16_reference_path(TINY, weights, quantized, (quantize, dequantize, "x"))
    assert all(v["impl"].startswith("reference: dequantize") for k, v in w4.plan.items() if k.startswith("linear."))
    # the same model with the dequantized weights in fp: what the int4 path must compute exactly
    deq = {**weights, "lm_head": dequantize(*quantized["lm_head"]),
           "layers": [{**lw, **{n: dequantize(*q[n]) for n in de.LINEARS}}
                      for lw, q in zip(weights["layers"], quantized["layers"], strict=True)]}
    deq_path = de.make_path("torch_fp16", TINY, deq)
    tokens = _prompt()
    got, exact, fp = _recompute(w4, tokens), _recompute(deq_path, tokens), _recompute(ref, tokens)
    assert de.rel_l2(got, exact) < 1e-5
    # int4 error bound: symmetric 4-bit, group 128 -> |dw| <= s/2, rms ~ s/sqrt(12) ~ 12% of the weights'
    w_err = max(de.rel_l2(dequantize(*quantized["layers"][0][n]), weights["layers"][0][n]) for n in de.LINEARS)
    assert 0.05 < w_err < 0.2
    # the logits see 4 quantized linears per layer plus lm_head; independent errors add in quadrature
    err = de.rel_l2(got, fp)
    assert 0.25 * w_err < err < 1.25 * (4 * TINY.layers + 1) ** 0.5 * w_err, (err, w_err)


def _fake_release(release_id: str, linear_nk: tuple[tuple[int, int], ...] = ()) -> Any:
    """A release with an in-process rmsnorm "kernel" (M 1..64, N 256, eps 1e-5) and reference-only
    gqa_decode and w4a16_linear: the dispatcher's real code, no TileLang artifact. With
    ``linear_nk``, also a ``linear`` operator in F.linear's layout (x [M, K], weight [N, K]) whose
    in-process "kernel" covers M 1..64 at those (N, K)."""
    from tileship.declare.spec import Specialization
    from tileship.runtime.dispatch import KERNEL, Decision, Entry, OpRunner, OpShape, Release

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-5)

    def gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        mask = (torch.arange(k.shape[1])[None, :] < lengths[:, None]).view(q.shape[0], 1, 1, -1)
        return de.sdpa_decode(q, k, v, lengths, mask)

    def w4(x: torch.Tensor, qw: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, de.packing()[1](qw, s))

    spec = Specialization("rmsnorm", "float32", (("M", (1, 64)), ("N", 256)), "c")
    decls = {
        "rmsnorm": {"inputs": [["X", ["M", "N"]], ["W", ["N"]]], "outputs": [["Y", ["M", "N"]]],
                    "config": {"eps": 1e-5}},
        "gqa_decode": {"inputs": [["Q", ["B", "H", "D"]], ["K", ["B", "S", "G", "D"]], ["V", ["B", "S", "G", "D"]],
                                  ["L", ["B"]]],
                       "outputs": [["O", ["B", "H", "D"]]]},
        "w4a16_linear": {"inputs": [["X", ["M", "K"]], ["QW", ["N", "K/8"]], ["S", ["N", "K/128"]]],
                         "outputs": [["Y", ["M", "N"]]]},
    }
    ops = {
        "rmsnorm": OpRunner(OpShape("rmsnorm", (("X", ("M", "N")), ("W", ("N",))), 1), rms,
                            [Entry(spec, rms, Decision(KERNEL, KERNEL, spec.id))]),
        "gqa_decode": OpRunner(OpShape("gqa_decode", tuple((n, tuple(d)) for n, d in decls["gqa_decode"]["inputs"]), 1),
                               gqa, []),
        "w4a16_linear": OpRunner(OpShape("w4a16_linear",
                                         tuple((n, tuple(d)) for n, d in decls["w4a16_linear"]["inputs"]), 1), w4, []),
    }
    if linear_nk:
        def lin(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(x, w)

        decls["linear"] = {"inputs": [["X", ["M", "K"]], ["W", ["N", "K"]]], "outputs": [["Y", ["M", "N"]]]}
        lspecs = [Specialization("linear", "float32", (("M", (1, 64)), ("N", n), ("K", k)), "c") for n, k in linear_nk]
        ops["linear"] = OpRunner(OpShape("linear", (("X", ("M", "K")), ("W", ("N", "K"))), 1), lin,
                                 [Entry(sp, lin, Decision(KERNEL, KERNEL, sp.id)) for sp in lspecs])
    return Release(release_id=release_id, path=None, kernel_revision="test", model={}, lock={}, lock_digest="",
                   drift=None, ops=ops, declarations=decls)


@torch.inference_mode()
def test_release_operators_run_as_custom_ops_and_their_decisions_are_counted():
    weights = _weights()
    release = _fake_release("dec0de0000000001")
    packer = de.packing()
    quantized = de.quantize_weights(weights, packer[0])
    ns = "tileship_dec0de0000000001"
    ts = de.make_path("tileship_fp16", TINY, weights, release=release)
    w4 = de.make_path("tileship_w4a16", TINY, weights, release=release, quantized=quantized, packer=packer)
    assert (
        ts.plan["rmsnorm"]["impl"] == "tileship:rmsnorm"
        and ts.plan["decode_attention"]["impl"] == "tileship:gqa_decode"
    )
    assert ts.plan["linear.o"]["impl"].startswith("torch:") and "no 'linear'" in ts.plan["linear.o"]["reason"]
    assert w4.plan["linear.down"]["impl"] == "tileship:w4a16_linear"
    assert ts.rmsnorm is getattr(torch.ops, ns).rmsnorm.default
    # eps differs from the declared one: the norm stays on PyTorch, and the plan says why
    other = de.make_path("tileship_fp16", de.Config(**{**TINY.__dict__, "eps": 1e-6}), weights, release=release)
    assert other.plan["rmsnorm"]["impl"] == "torch:F.rms_norm" and "eps" in other.plan["rmsnorm"]["reason"]

    torch_path = de.make_path("torch_fp16", TINY, weights)
    ref4 = de.w4a16_reference_path(TINY, weights, quantized, packer)
    for path, want_path in ((ts, torch_path), (w4, ref4)):
        out = []
        for p in (path, want_path):
            st = de.new_state(TINY, B, CAP, TINY.layers, torch.float32, "cpu")
            de.prefill(p, TINY, st, _prompt())
            before = release.counters()
            logits = de.make_stepper(p, TINY, st, compiled=False).step()
            out.append((logits, de.counters_delta(before, release.counters())))
        (got, counts), (want, none) = out
        assert de.rel_l2(got, want) < 1e-5 and none == {}
        n = TINY.layers
        assert counts["rmsnorm"] == {"kernel:kernel": 2 * n + 1}  # decode M=B=2 is inside 1..64
        assert counts["gqa_decode"] == {"reference:device_not_covered": n}
        if path is w4:
            assert counts["w4a16_linear"] == {"reference:device_not_covered": 4 * n + 1}


@torch.inference_mode()
def test_a_linear_operator_in_f_linear_layout_takes_the_weights_as_they_are():
    """The fp16 path's linear role with an operator declared as F.linear (weight [N, K]): the
    covered layers call it with the untransposed weight (logits equal the torch path's), an
    (N, K) it does not declare stays on F.linear and the plan names why."""
    weights = _weights()
    shapes = TINY.linear_shapes()
    covered = tuple(shapes[n] for n in ("o", "gate_up", "down"))  # not qkv's (N, K), which lm_head shares
    release = _fake_release("dec0de0000000002", linear_nk=covered)
    ts = de.make_path("tileship_fp16", TINY, weights, release=release)
    assert all(ts.plan[f"linear.{n}"]["impl"] == "tileship:linear" for n in ("o", "gate_up", "down")), ts.plan
    for n in ("qkv", "lm_head"):
        assert ts.plan[f"linear.{n}"]["impl"].startswith("torch:"), ts.plan
        assert "declares no float32 specialization" in ts.plan[f"linear.{n}"]["reason"]
    out = []
    for p in (ts, de.make_path("torch_fp16", TINY, weights)):
        st = de.new_state(TINY, B, CAP, TINY.layers, torch.float32, "cpu")
        de.prefill(p, TINY, st, _prompt())
        before = release.counters()
        out.append((de.make_stepper(p, TINY, st, compiled=False).step(), de.counters_delta(before, release.counters())))
    (got, counts), (want, _) = out
    assert de.rel_l2(got, want) < 1e-5
    assert counts["linear"] == {"kernel:kernel": 3 * TINY.layers}


def test_main_writes_the_documented_json(tmp_path: Path):
    out = tmp_path / "decode_e2e.json"
    rc = de.main(["--device", "cpu", "--modes", "eager", *TINY_FLAGS, "--batches", "1,2", "--contexts", str(CAP),
                  "--decode-room", "8", "--check-batch", "1", "--check-steps", "8", "--logit-steps", "4", "--iters",
                  "4", "--repeats", "1", "--profile-replays", "1", "--out", str(out)])
    data = json.loads(out.read_text())
    assert rc == 0, data["failures"]
    assert set(data["ratio_direction"]) >= {"ratio", "ratio_w4a16", "ratio_w4a16_vs_torch", "ratio_fp16_vs_torch",
                                            "tokens_per_s"}
    assert data["release"] is None and data["notes"] and data["w4a16_packing"]
    entry = data["dtypes"]["float16"]
    assert set(entry["plans"]) == set(de.PATHS)
    for b in (1, 2):
        case = entry["cases"][f"decode_b{b}_ctx{CAP}"]
        assert case["prompt"] == CAP - 8 and case["layers"] == 2 and case["batch"] == b
        assert {"torch_ms", "tileship_ms", "w4a16_ms", "ratio", "ratio_w4a16_vs_torch"} <= set(case["prefill"])
        row = case["modes"]["eager"]
        assert {"torch_ms", "tileship_ms", "ratio", "w4a16_ms", "ratio_w4a16", "ratio_w4a16_vs_torch",
                "ratio_fp16_vs_torch"} <= set(row)
        assert row["ratio"] == pytest.approx(row["tileship_ms"] / row["torch_ms"], rel=1e-3)
        assert row["ratio_w4a16_vs_torch"] == pytest.approx(row["torch_ms"] / row["w4a16_ms"], rel=1e-3)
        for p in de.PATHS:
            pm = row["paths"][p]
            assert pm["tokens_per_s"] == pytest.approx(b * 1e3 / pm["step_ms"], rel=1e-2)
            assert pm["prefill_ms"] > 0 and "dispatch_per_step" in pm
            shares = pm["profile"]["shares"]
            assert set(shares) == set(de.CATEGORIES) and sum(shares.values()) == pytest.approx(1, abs=1e-3)
        if b == 1:
            assert row["greedy_match"]["match"] and row["greedy_match"]["steps"] == 8
            check = case["w4a16_logits"]["eager"]
            assert check["ok"] and check["steps"] == 4 and len(check["rel_l2_per_step"]) == 5
            assert row["paths"]["torch_fp16"]["lengths_after_check"] == CAP
        else:
            assert "greedy_match" not in row and "w4a16_logits" not in case
    assert data["failures"] == []


def test_profile_attribution_follows_the_launching_op_into_graph_replays():
    """TileLang kernels are all ``main_kernel``: the op that launched each one (seen in a non-graph
    step) names its category in the graph replays, by launch order when the counts match."""
    from types import SimpleNamespace as E

    def ev(name: str, start: float, kernels: tuple[str, ...] = (), parent: Any = None) -> Any:
        return E(name=name, cpu_parent=parent, kernels=[E(name=k) for k in kernels], time_range=E(start=start))

    w4 = ev("tileship_abc::w4a16_linear", 3)
    events = [ev("tileship_abc::gqa_decode", 2, ("main_kernel",)), ev("tileship_abc::rmsnorm", 1, ("main_kernel",)), w4,
              ev("aten::mm", 3.5, ("nvjet_hsh_64x8_2cta",), parent=w4),
              ev("triton_poi_fused_index_copy_0", 0, ("triton_poi_fused_index_copy_0",)),
              ev("aten::argmax", 5, ("reduce_kernel",))]
    roles = {"gqa_decode": "attention", "rmsnorm": "rmsnorm", "w4a16_linear": "w4a16"}
    seq = de._launch_sequence(events, roles)
    assert seq == [("triton_poi_fused_index_copy_0", "rope/cache-write"), ("main_kernel", "norm"),
                   ("main_kernel", "attention"), ("nvjet_hsh_64x8_2cta", "w4a16"), ("reduce_kernel", None)]
    replay = [("triton_poi_fused_index_copy_0", 1.0), ("main_kernel", 2.0), ("main_kernel", 10.0),
              ("nvjet_hsh_64x8_2cta", 6.0), ("reduce_kernel", 1.0)]
    records, how = de.attribute(replay * 2, seq, 2)
    assert how.startswith("launch order")
    out = de.summarize(records, 2, "graph replays", how)
    assert (
        out["ms_per_step"]["attention"] == 0.01
        and out["ms_per_step"]["norm"] == 0.002
        and out["ms_per_step"]["w4a16"] == 0.006
    )
    assert out["shares"]["other"] == pytest.approx(1 / 20) and out["kernels_per_step"] == 5
    # counts differ (an extra memset in the replay): aligned by name, so each main_kernel still gets its op
    records, how = de.attribute([*replay[:3], ("Memset (Device)", 0.5), *replay[3:]], seq, 1)
    assert how.startswith("launch order aligned")
    assert [c for _, _, c in records] == ["rope/cache-write", "norm", "attention", None, "w4a16", None]
    # and with a launch the graph dropped (no index_copy in the replay), over two replays
    records, how = de.attribute(replay[1:] * 2, seq, 2)
    assert [c for _, _, c in records[:4]] == ["norm", "attention", "w4a16", None] and records[4:] == records[:4]
    # replays of different lengths: by name; main_kernel came from two ops, so it cannot be placed
    records, how = de.attribute([*replay, ("Memset (Device)", 0.5)] + replay, seq, 2)
    assert how.startswith("by kernel name")
    cats = {n: c for n, _, c in records}
    assert cats["main_kernel"] is None and cats["nvjet_hsh_64x8_2cta"] == "w4a16" and cats["Memset (Device)"] is None
    assert de.summarize(records, 2, "x", how)["ms_per_step"]["other"] == pytest.approx(
        (12.0 + 1.0 + 0.5 + 12 + 1) / 2e3, abs=1e-4
    )
    # name patterns for kernels no op claims
    assert de.classify("fmha_cutlassF_f16_aligned_64x128_rf_sm80") == "attention"
    assert de.classify("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1") == "norm"
    assert (
        de.classify("sm90_xmma_gemm_f16f16_f16f32") == "linear/gemm"
        and de.classify("gemv2T_kernel_val") == "linear/gemm"
    )
    assert de.classify("main_kernel") is None


@torch.inference_mode()
def test_the_compiled_step_writes_the_cache_in_place_and_matches_eager():
    """compile+graph mode compiles a layer's two halves around the eager in-place cache write: the
    compiled step must produce the eager step's logits and write the same rows of the same storage."""
    p = de.make_path("torch_fp16", TINY, _weights())
    prompt = _prompt()
    states = []
    for compiled in (False, True):
        st = de.new_state(TINY, B, CAP, TINY.layers, torch.float32, "cpu")
        de.prefill(p, TINY, st, prompt)
        ptrs = [t.data_ptr() for t in (*st.k, *st.v)]
        stepper = de.make_stepper(p, TINY, st, compiled=compiled)
        logits = [stepper.step().clone() for _ in range(3)]
        assert [t.data_ptr() for t in (*st.k, *st.v)] == ptrs  # the cache is written where it lives
        states.append((st, logits))
    (eager, le), (comp, lc) = states
    for a, b in zip(le, lc, strict=True):
        assert de.rel_l2(b, a) < 1e-4
    for layer in range(TINY.layers):
        assert torch.allclose(comp.k[layer], eager.k[layer], atol=1e-5) and torch.allclose(
            comp.v[layer], eager.v[layer], atol=1e-5
        )
    assert comp.lengths.tolist() == eager.lengths.tolist() == [PLEN + 3] * B


def test_greedy_check_tells_a_tie_from_a_wrong_token():
    """The first difference is found over every row; a token torch itself ranks within 2 fp16 ulps of its top
    logit is a near tie (not a failure), one a whole logit behind is a wrong token."""
    ta = torch.tensor([[1, 2, 3], [4, 5, 6]])
    tb = torch.tensor([[1, 2, 3], [4, 7, 9]])
    logits = torch.zeros(2, 2, 10, dtype=torch.float16)
    logits[1, 0, 5] = 3.0
    logits[1, 0, 7] = 3.0
    tie = de.greedy_check({"tokens": ta, "logits": logits, "prefill_logits": logits[:, 0]}, {"tokens": tb}, 2)
    assert (tie["match"], tie["near_tie"], tie["first_mismatch_step"], tie["first_mismatch_row"]) == (False, True, 1, 1)
    logits[1, 0, 7] = 2.0
    wrong = de.greedy_check({"tokens": ta, "logits": logits, "prefill_logits": logits[:, 0]}, {"tokens": tb}, 2)
    assert wrong["near_tie"] is False and wrong["tileship_token_behind_top"] == 1.0
    assert de.greedy_check({"tokens": ta}, {"tokens": ta.clone()}, 2)["match"] is True
