"""cffi API-mode builder for ``beast.native._ext``.

Used two ways:

- by setuptools, through ``cffi_modules=["beast/native/build.py:ffibuilder"]``
  in ``setup.py`` (so ``pip install -e .`` builds the extension);
- directly, ``python beast/native/build.py``, which builds the extension in
  place (``beast/native/_ext.*.so``) for development.

Source paths are derived from this file's location and expressed relative to
the repository root: setuptools runs from the root, and the direct build below
compiles with the root as cffi's working directory.
"""

import os
import re

import cffi

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
_NATIVE = os.path.relpath(_HERE, _ROOT)  # "beast/native"

_HEADERS = ("index_queue.h", "batcher.h", "sum_tree.h", "acting.h")
_SOURCES = ("index_queue.c", "batcher.c", "sum_tree.c", "acting.c")

# Declarations Python may use: each header's lines between these two marks, read from
# the headers themselves so that the two never differ. Includes, include guards and
# inline helpers stay outside the marks: cffi's parser cannot read the system headers
# those include.
_CDEF_BEGIN = "/* cffi cdef begin"
_CDEF_END = "/* cffi cdef end */"


def _declarations(header: str) -> str:
    """The marked declarations of `header`, each macro's value left to the compiler
    (``#define NAME ...``): cffi's parser reads only plain integers, not ``(1u << 28)``."""
    with open(os.path.join(_HERE, header)) as f:
        text = f.read()
    begin = text.index("\n", text.index(_CDEF_BEGIN))
    end = text.index(_CDEF_END, begin)
    return re.sub(r"^#define (\w+) .*$", r"#define \1 ...", text[begin:end], flags=re.MULTILINE)


_CDEF = "".join(_declarations(name) for name in _HEADERS)

ffibuilder = cffi.FFI()
ffibuilder.cdef(_CDEF)
ffibuilder.set_source(
    "beast.native._ext",
    "".join(f'#include "{name}"\n' for name in _HEADERS),
    sources=[os.path.join(_NATIVE, name) for name in _SOURCES],
    include_dirs=[_NATIVE],
    depends=[os.path.join(_NATIVE, name) for name in _HEADERS],
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
    libraries=["pthread", "m"],
    # What setuptools picks anyway; the direct build then writes the same
    # `_ext.abi3.so`, so a stale development build can never shadow (by
    # import-suffix priority) the one `pip install -e .` made.
    py_limited_api=True,
)

if __name__ == "__main__":
    # tmpdir is the root: cffi chdirs there, so the relative paths above
    # resolve, and the dotted module name puts the output in beast/native/.
    ffibuilder.compile(tmpdir=_ROOT, verbose=True)
