"""`tileship serve --llama`: a whole Llama decoder swapped onto the live release, served as a
model next to the operators. Real "c"-target kernels (tests/test_swap.py's release: naive
gemm and attention, rmsnorm_cpu), the official tritonclient, a free 127.0.0.1 port.

The tiny model (hidden 1024, 8 heads of 128, intermediate 1536, vocab 64, one layer) has
q/k/v/o, the attention core and the three norms on kernels and the MLP and LM head on
PyTorch; (batch 1, seq 16) is the attention's declared shape, (2, 8) is not.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from test_serve import assert_close, client, copy_release, point, post, serving
from test_swap import swap_release_build  # noqa: F401  (the module-scoped release fixture)
from tritonclient.utils import InferenceServerException

from examples.llama import random_llama
from examples.llama.serve import LlamaSpec, parse_spec
from tileship.errors import DeclarationError
from tileship.release import bundle
from tileship.serve import ServeConfig
from tileship.serve.validate import RequestLimits

SEED = 3


def spec_file(tmp: Path, **extra: Any) -> Path:
    path = tmp / "llama.json"
    path.write_text(json.dumps({"preset": "tiny", "seed": SEED, "names": {"rmsnorm": "rmsnorm_cpu"}, **extra}))
    return path


def local_model(spec: LlamaSpec) -> Any:
    """What a client rebuilds from the served metadata: the plain-PyTorch model."""
    return random_llama(spec.config(), dtype=getattr(torch, spec.dtype), seed=spec.seed)


def ask(c: triton.InferenceServerClient, ids: np.ndarray, *, datatype: str = "INT64", name: str = "input_ids",
        binary: bool = True) -> triton.InferResult:
    i = triton.InferInput(name, list(ids.shape), datatype)
    i.set_data_from_numpy(ids, binary_data=binary)
    return c.infer("llama", [i], outputs=[triton.InferRequestedOutput("logits", binary_data=binary)])


@pytest.fixture(scope="module")
def llama_server(swap_release_build, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("llama")
    spec = parse_spec(str(spec_file(tmp)))
    cfg = ServeConfig(source=swap_release_build.path, diagnostics_dir=tmp / "diag", log_stream=io.StringIO(),
                      llama=spec)
    with serving(cfg) as srv:
        yield srv, spec


@pytest.mark.parametrize("shape,binary,path,kernel,reference", [
    ((1, 16), True, "kernel", 8, 0),
    ((1, 16), False, "kernel", 8, 0),
    # attention B=2, S=8 is not declared: its reference; the GEMMs (M=16) stay on kernels
    ((2, 8), True, "mixed", 7, 1),
], ids=["declared-binary", "declared-json", "undeclared-attention"])
def test_logits_match_the_pytorch_model_and_name_the_dispatch(llama_server, swap_release_build,  # noqa: F811
                                                              shape, binary, path, kernel, reference):
    srv, spec = llama_server
    ids = np.random.default_rng(sum(shape)).integers(0, spec.vocab, size=shape, dtype=np.int64)
    c = client(srv)
    try:
        res = ask(c, ids, binary=binary)
    finally:
        c.close()
    with torch.no_grad():
        want = local_model(spec)(torch.from_numpy(ids))
    got = res.as_numpy("logits")
    assert got.dtype == np.float32 and got.shape == (*shape, spec.vocab)
    assert_close(got, want, atol=1e-3, rtol=1e-3)
    p = res.get_response()["parameters"]
    assert p["tileship_release"] == swap_release_build.release_id and p["tileship_kernel_revision"]
    assert (p["tileship_path"], p["tileship_kernel_calls"], p["tileship_reference_calls"],
            p["tileship_pytorch_layers"]) == (path, kernel, reference, 4)
    layers = json.loads(p["tileship_dispatch"])
    assert layers["layers.0.attn.q_proj"] == "kernel" and layers["norm"] == "kernel"
    assert layers["layers.0.attn.core"] == ("kernel" if path == "kernel" else "reference:undeclared_shape")
    assert {m for m, v in layers.items() if v == "pytorch"} == {"layers.0.mlp.gate_proj", "layers.0.mlp.up_proj",
                                                                "layers.0.mlp.down_proj", "lm_head"}


def test_metadata_readiness_and_index(llama_server, swap_release_build):  # noqa: F811
    srv, spec = llama_server
    rid = swap_release_build.release_id
    c = client(srv)
    try:
        meta = c.get_model_metadata("llama")
        assert meta["versions"] == [rid]
        assert meta["inputs"] == [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]}]
        assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, -1, spec.vocab]}]
        assert json.loads(meta["parameters"]["config"])["seed"] == SEED
        assert json.loads(meta["parameters"]["layers"])["lm_head"].startswith("pytorch: ")
        assert c.is_model_ready("llama") and c.is_model_ready("llama", rid) and c.is_model_ready("gemm")
        with pytest.raises(InferenceServerException) as e:
            c.get_model_metadata("llama", "not-this-version")
        assert e.value.status() == "404" and rid in e.value.message()
    finally:
        c.close()
    rows = {x["name"]: x for x in post(srv, "/v2/repository/index").json()}
    assert (
        rows["llama"]["state"] == "READY"
        and rows["llama"]["version"] == rid
        and "8 of 12 candidate layers" in rows["llama"]["reason"]
    )


@pytest.mark.parametrize("ids,kw,words", [
    (np.zeros((1, 4), np.float32), {"datatype": "FP32"}, "wrong datatype: input input_ids is FP32"),
    (np.zeros((1, 4), np.int32), {"datatype": "INT32"}, "accepts INT64"),
    (np.zeros(4, np.int64), {}, "wrong rank: input input_ids has shape [4] (rank 1)"),
    (np.zeros((1, 2, 4), np.int64), {}, "(rank 3)"),
    (np.array([[1, 64]], np.int64), {}, "token id out of range: input input_ids holds 64; model llama has vocab 64"),
    (np.array([[-1, 2]], np.int64), {"binary": False}, "holds -1"),
    (np.zeros((1, 65), np.int64), {}, "at most max_seq=64"),
    (np.zeros((1, 4), np.int64), {"name": "ids"}, "takes one input, input_ids"),
], ids=["fp32", "int32", "rank1", "rank3", "id-too-big", "id-negative-json", "too-long", "wrong-name"])
def test_bad_input_is_400_naming_the_problem(llama_server, ids, kw, words):
    srv, _ = llama_server
    c = client(srv)
    try:
        with pytest.raises(InferenceServerException) as e:
            ask(c, ids, **kw)
    finally:
        c.close()
    assert e.value.status() == "400" and words in e.value.message(), e.value.message()


def test_a_call_past_the_output_limit_is_413_before_it_runs(swap_release_build, tmp_path):  # noqa: F811
    """The whole model's call counts against --max-output-mib as an operator's does: its logits and its widest
    activation (tiny: intermediate 1536 floats a token), checked before it runs. It used to run whatever batch came:
    a 64 MiB body of token ids is 8M tokens, tens of GiB of activations, and the process was killed for memory."""
    spec = parse_spec(str(spec_file(tmp_path)))
    cfg = ServeConfig(source=swap_release_build.path, diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO(),
                      llama=spec, limits=RequestLimits(max_output_bytes=1 << 20))
    with serving(cfg) as srv:
        c = client(srv)
        try:
            with pytest.raises(InferenceServerException) as e:
                ask(c, np.zeros((3, 64), np.int64))  # 192 tokens x 1536 x 4 bytes: past 1 MiB
            assert e.value.status() == "413", e.value.message()
            assert ("model llama: this call would produce 1228800 bytes of outputs (logits=49152, activation=1179648)"
                    in e.value.message())
            assert ask(c, np.zeros((2, 64), np.int64)).as_numpy("logits").shape == (2, 64, spec.vocab)
        finally:
            c.close()
        calls = [json.loads(x) for x in srv.service.config.log_stream.getvalue().splitlines()]
        assert [x["status"] for x in calls if x.get("event") == "infer"] == [413, 200]


def test_reload_rebinds_the_model_and_a_release_it_cannot_swap_onto_keeps_the_old(swap_release_build,  # noqa: F811
                                                                                   cpu_release_build, tmp_path):
    a = copy_release(swap_release_build.path, tmp_path / "a")
    b = copy_release(swap_release_build.path, tmp_path / "b", version="2")
    id_a, id_b = bundle.read_manifest(a)["release_id"], bundle.read_manifest(b)["release_id"]
    link = tmp_path / "current"
    point(link, a)
    # attention served by "add": absent from the swap release (the core stays on PyTorch), but
    # the CPU catalog's add is 1-D, so swapping onto that release raises DeclarationError
    spec = parse_spec(str(spec_file(tmp_path, names={"rmsnorm": "rmsnorm_cpu", "attention": "add"})))
    ids = np.arange(16, dtype=np.int64).reshape(1, 16) % spec.vocab
    with torch.no_grad():
        want = local_model(spec)(torch.from_numpy(ids))
    with serving(ServeConfig(source=link, diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO(),
                             llama=spec)) as srv:
        c = client(srv)
        try:
            p = ask(c, ids).get_response()["parameters"]
            assert (p["tileship_release"], p["tileship_kernel_calls"], p["tileship_pytorch_layers"]) == (id_a, 7, 5)
            point(link, b)
            r = post(srv, "/v2/repository/reload")
            assert r.status_code == 200 and r.json()["release"] == id_b
            bound = srv.service.holder.current.models["llama"]
            assert bound.release_id == id_b
            assert bound.model.layers[0].attn.q_proj.op.runner is srv.service.holder.current.release.ops["gemm"]
            res = ask(c, ids)
            assert res.get_response()["parameters"]["tileship_release"] == id_b
            assert_close(res.as_numpy("logits"), want, atol=1e-3, rtol=1e-3)
            point(link, cpu_release_build.path)
            r = post(srv, "/v2/repository/reload")
            assert (
                r.status_code == 409
                and r.json()["serving"] == id_b
                and "'add'" in r.json()["error"]
                and "attention" in r.json()["error"]
            )
            res = ask(c, ids)
            assert res.get_response()["parameters"]["tileship_release"] == id_b
            assert_close(res.as_numpy("logits"), want, atol=1e-3, rtol=1e-3)
            assert httpx.get(srv.url + "/v2/health/ready").json()["release"] == id_b
        finally:
            c.close()


@pytest.mark.parametrize("text,words", [
    ('{"preset": "tiny", "heads": 7}', "multiple of n_heads"),
    ('{"preset": "tiny", "dtype": "int8"}', "dtype must be one of"),
    ('{"preset": "tiny", "layer": 2}', "unknown keys ['layer']"),
    ('{"hidden": 64}', "missing vocab, heads, intermediate, layers"),
    ('{"preset": "huge"}', "unknown preset 'huge'"),
    ("[1]", "must hold a JSON object"),
])
def test_bad_llama_config_is_refused_naming_the_key(tmp_path, text, words):
    f = tmp_path / "cfg.json"
    f.write_text(text)
    with pytest.raises(DeclarationError) as e:
        parse_spec(str(f))
    assert words in str(e.value) and "--llama" in str(e.value)


def test_presets_parse_and_unknown_names_are_refused():
    assert parse_spec("7b-2layer").config().hidden == 4096 and parse_spec("7b-2layer").dtype == "float16"
    with pytest.raises(DeclarationError, match="neither a preset"):
        parse_spec("7b")
