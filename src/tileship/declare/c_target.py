"""What the CPU ``"c"`` target cannot compile, found in the traced kernel before the compiler runs.

TileLang's C code generator has no type for ``bfloat16`` and the 8-bit floats (``InternalError: Cannot convert
type bfloat16 to C type``), passes a ``bool`` tensor where its wrapper wants ``int8_t*`` (the compiler fails:
``cannot convert 'bool*' to 'int8_t*'``), and writes each kernel parameter's name into C++ source as it is, so a
parameter named ``int``, ``default`` or ``NULL`` is a syntax error (``expected ',' or '...' before 'int'``).
``check`` refuses such a specialization with a ``BuildError`` naming the specialization, the parameter and the
reason; like any specialization that fails to build, the others build and the reference serves its calls.
"""

from __future__ import annotations

from typing import Any

from tileship.errors import BuildError

#: dtypes the C code generator has no type for
NO_C_TYPE = frozenset(("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e4m3fnuz",
                       "float8_e5m2fnuz", "float4_e2m1fn"))
#: C and C++ keywords, and the names the generated code itself uses as types or macros
C_RESERVED = frozenset((
    "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
    "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr",
    "constinit", "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete",
    "do", "double", "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for",
    "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
    "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "register", "reinterpret_cast",
    "requires", "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct", "switch",
    "template", "this", "thread_local", "throw", "true", "try", "typedef", "typeid", "typename", "union",
    "unsigned", "using", "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq",
    "_Alignas", "_Alignof", "_Atomic", "_Bool", "_Complex", "_Generic", "_Imaginary", "_Noreturn", "_Static_assert",
    "_Thread_local", "NULL", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t",
    "uint64_t", "size_t"))


def check(spec: Any, func: Any) -> None:
    """Raise BuildError for the first parameter of the traced ``func`` that the ``"c"`` target cannot compile at
    ``spec`` (a dtype it has no type for, a bool tensor, a name C or C++ reserves); None for another target."""
    if spec.target != "c":
        return
    bmap = func.buffer_map
    for p in func.params:
        buf = bmap.get(p)
        name = str(buf.name if buf is not None else p.name)
        dtype = str(buf.dtype if buf is not None else p.dtype)
        what = f"the kernel's parameter {name!r}"
        if name in C_RESERVED:
            raise BuildError(f"{what} is named with a C/C++ reserved word, which the CPU \"c\" target writes into its "
                             "C++ source as it is (a syntax error)", spec_id=spec.id,
                             hint=f"rename the kernel's parameter (and its TensorArg/ScalarArg), e.g. {name}_; "
                                  "the reference serves this specialization meanwhile")
        if dtype in NO_C_TYPE:
            raise BuildError(f"{what} is {dtype}, which the CPU \"c\" target cannot compile (TileLang's C code "
                             "generator has no such type)", spec_id=spec.id,
                             hint=f"build {dtype} for a GPU target only; on \"c\" the reference serves it")
        if dtype == "bool" and buf is not None:
            raise BuildError(f"{what} is a bool tensor, which the CPU \"c\" target cannot pass (its wrapper takes "
                             "int8_t*, the kernel bool*)", spec_id=spec.id,
                             hint="declare it uint8 or int8 (torch's x.to(torch.uint8)) to build it for \"c\"; "
                                  "on \"c\" the reference serves it meanwhile")


#: scalar dtypes TileLang's tvm-ffi host wrapper (the CUDA targets) cannot declare: ``half a = ...`` in host C that
#: has no ``half`` (g++: ``'half' was not declared in this scope``), and an internal error for ``bfloat16``
#: (``Check failed: (dtype.is_float()) is false``)
NO_HOST_SCALAR = frozenset(("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e4m3fnuz",
                            "float8_e5m2fnuz", "float4_e2m1fn"))


def check_host_scalars(spec: Any, func: Any) -> None:
    """Raise BuildError for a by-value parameter of the traced ``func`` whose dtype the GPU targets' host wrapper
    cannot pass (``NO_HOST_SCALAR``), naming the specialization and the parameter; None for the "c" target (its
    library takes a float16 by value) and for a kernel without such a parameter."""
    if spec.target == "c":
        return
    for p in func.params:
        dtype = str(p.dtype)
        if func.buffer_map.get(p) is None and dtype in NO_HOST_SCALAR:
            raise BuildError(f"the kernel's parameter {str(p.name)!r} is a {dtype} scalar, which TileLang's host "
                             f"wrapper for {spec.target} cannot pass (its generated C has no {dtype} type)",
                             spec_id=spec.id, hint=f"declare it ScalarArg(..., dtype=\"float32\") with a T.float32 "
                                                   f"parameter and cast it in the kernel (T.cast(a, \"{dtype}\"))")


__all__ = ["C_RESERVED", "NO_C_TYPE", "NO_HOST_SCALAR", "check", "check_host_scalars"]
