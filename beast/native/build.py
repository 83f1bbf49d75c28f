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

import cffi

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
_NATIVE = os.path.relpath(_HERE, _ROOT)  # "beast/native"

# Declarations Python may use; kept in step with index_queue.h by hand (cffi's
# parser cannot read the system headers that file includes).
_CDEF = """
enum beast_status {
    BEAST_OK = 0,
    BEAST_ETIMEDOUT = 1,
    BEAST_ECLOSED = 2,
    BEAST_EFULL = 3,
    BEAST_EINVAL = 4,
    BEAST_EINTR = 5,
    BEAST_ENOTRECOVERABLE = 6,
    BEAST_ESYS = 7,
};
#define BEAST_QUEUE_MAX_CAPACITY ...

size_t beast_queue_nbytes(uint32_t capacity);
int beast_queue_init(void *mem, size_t nbytes, uint32_t capacity);
int beast_queue_put(void *mem, int32_t value);
int beast_queue_get(void *mem, int32_t *out, int64_t timeout_ns);
int beast_queue_close(void *mem);
int beast_queue_size(void *mem, uint32_t *out);
int beast_queue_capacity(void *mem, uint32_t *out);
int beast_queue_owner_deaths(void *mem, uint32_t *out);
"""

ffibuilder = cffi.FFI()
ffibuilder.cdef(_CDEF)
ffibuilder.set_source(
    "beast.native._ext",
    '#include "index_queue.h"',
    sources=[os.path.join(_NATIVE, "index_queue.c")],
    include_dirs=[_NATIVE],
    depends=[os.path.join(_NATIVE, "index_queue.h")],
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
    libraries=["pthread"],
    # What setuptools picks anyway; the direct build then writes the same
    # `_ext.abi3.so`, so a stale development build can never shadow (by
    # import-suffix priority) the one `pip install -e .` made.
    py_limited_api=True,
)

if __name__ == "__main__":
    # tmpdir is the root: cffi chdirs there, so the relative paths above
    # resolve, and the dotted module name puts the output in beast/native/.
    ffibuilder.compile(tmpdir=_ROOT, verbose=True)
