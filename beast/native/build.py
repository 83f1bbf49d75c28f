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

_HEADERS = ("index_queue.h", "batcher.h", "sum_tree.h", "acting.h")
_SOURCES = ("index_queue.c", "batcher.c", "sum_tree.c", "acting.c")

# Declarations Python may use; kept in step with the headers by hand (cffi's
# parser cannot read the system headers those files include).
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
    BEAST_EEMPTY = 8,
};
#define BEAST_QUEUE_MAX_CAPACITY ...
#define BEAST_NO_OWNER ...

size_t beast_queue_nbytes(uint32_t capacity);
int beast_queue_init(void *mem, size_t nbytes, uint32_t capacity);
int beast_queue_put(void *mem, int32_t value);
int beast_queue_get(void *mem, int32_t *out, int64_t timeout_ns);
int beast_queue_close(void *mem);
int beast_queue_size(void *mem, uint32_t *out);
int beast_queue_capacity(void *mem, uint32_t *out);
int beast_queue_owner_deaths(void *mem, uint32_t *out);
int beast_queue_get_marked(void *mem, int32_t *out, int64_t timeout_ns, int64_t *marks,
                           uint32_t n_marks, int64_t mark);
int beast_queue_put_marked(void *mem, int32_t value, int64_t *marks, uint32_t n_marks,
                           int64_t mark);
int beast_queue_reclaim(void *free_mem, void *full_mem, int64_t *marks, uint32_t n_marks,
                        int32_t value, int64_t owner, int32_t *returned);
int beast_queue_snapshot(void *mem, int32_t *out, uint32_t room, uint32_t *n_out);

#define BEAST_BATCHER_MAX_SLOTS ...
struct beast_batcher_stats {
    uint64_t posted;
    uint64_t answered;
    uint64_t dropped;
    uint64_t stale;
};

size_t beast_batcher_nbytes(uint32_t num_groups, uint32_t group_size, uint32_t num_servers);
int beast_batcher_init(void *mem, size_t nbytes, uint32_t num_groups, uint32_t group_size,
                       uint32_t num_servers);
int beast_batcher_sizes(void *mem, uint32_t *num_groups, uint32_t *group_size,
                        uint32_t *num_servers);
int beast_batcher_server_groups(void *mem, uint32_t server, uint32_t *lo, uint32_t *hi);
int beast_batcher_post(void *mem, uint32_t group, uint32_t count);
int beast_batcher_wait_answered(void *mem, uint32_t group, int64_t timeout_ns);
int beast_batcher_collect(void *mem, uint32_t server, int64_t *out, uint32_t max_batch,
                          uint32_t min_batch, int64_t timeout_ns, int64_t window_ns,
                          uint32_t *n_out);
int beast_batcher_answer(void *mem, const int64_t *indices, uint32_t n);
int beast_batcher_reset_group(void *mem, uint32_t group);
int beast_batcher_pending(void *mem, uint32_t group, uint32_t *out);
int beast_batcher_close(void *mem);
int beast_batcher_stats(void *mem, struct beast_batcher_stats *out);

#define BEAST_SUMTREE_MAX_CAPACITY ...
struct beast_sumtree_stats {
    double total;
    double max;
    uint64_t claims;
    uint32_t owner_deaths;
};

size_t beast_sumtree_nbytes(uint32_t capacity);
int beast_sumtree_init(void *mem, size_t nbytes, uint32_t capacity);
int beast_sumtree_capacity(void *mem, uint32_t *out);
int beast_sumtree_update(void *mem, const int64_t *indices, const double *priorities,
                         const uint64_t *generations, uint32_t n, uint32_t *applied);
int beast_sumtree_get(void *mem, const int64_t *indices, uint32_t n, double *priorities,
                      uint64_t *generations);
int beast_sumtree_sample(void *mem, const double *draws, uint32_t n, int64_t *indices,
                         uint64_t *generations, double *priorities, double *total);
int beast_sumtree_claim(void *mem, int64_t *index, uint64_t *generation);
int beast_sumtree_commit(void *mem, int64_t index, uint64_t generation, double priority,
                         uint32_t *applied);
int beast_sumtree_invalidate(void *mem, const int64_t *indices, uint32_t n,
                             uint64_t *generations);
int beast_sumtree_stats(void *mem, struct beast_sumtree_stats *out);
int beast_sumtree_export(void *mem, double *priorities, uint64_t *generations,
                         uint32_t capacity, uint64_t *claims, uint64_t *cursor);
int beast_sumtree_restore(void *mem, const double *priorities, const uint64_t *generations,
                          uint32_t capacity, uint64_t claims, uint64_t cursor);

struct beast_rng {
    uint64_t s[4];
};
void beast_rng_seed(struct beast_rng *rng, uint64_t seed);
double beast_rng_uniform(struct beast_rng *rng);
int beast_sample_softmax(struct beast_rng *rng, const float *logits, uint32_t rows,
                         uint32_t num_actions, int64_t *actions);
struct beast_copy {
    void *dst;
    const void *src;
    uint64_t nbytes;
    uint64_t dst_step;
};
int beast_copy_run(const struct beast_copy *copies, uint32_t n, uint32_t step,
                   uint32_t max_step);
"""

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
