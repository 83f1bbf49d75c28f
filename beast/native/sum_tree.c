/*
 * beast/native/sum_tree.c -- see sum_tree.h for the contract.
 *
 * Layout of the caller's block:
 *
 *   struct beast_sumtree   header: sizes, claim counter, the mutex
 *   double sum[2 * P]      implicit binary tree, root at 1, leaves at
 *                          [P, P + capacity); P is the smallest power of two
 *                          >= capacity and leaves past capacity stay 0
 *   double max[2 * P]      the same tree with max instead of +
 *   uint64_t gen[capacity] generation of each leaf
 *   int32_t writer[capacity] pid of the process writing the slot's data
 *                          between claim and commit, 0 when none
 *
 * sum[0] and max[0] are unused, so node k's children are 2k and 2k + 1.
 * Each array starts on a 64-byte boundary.
 */
#define _GNU_SOURCE
#include "sum_tree.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

/* "beastST1" little-endian: identifies an initialised block. */
#define BEAST_SUMTREE_MAGIC 0x3154537473616562ULL

#define CACHE_LINE 64

struct beast_sumtree {
  uint64_t magic;        /* BEAST_SUMTREE_MAGIC once initialised */
  uint32_t capacity;     /* immutable after init */
  uint32_t leaves;       /* P: immutable after init */
  uint64_t claims;       /* claims ever made */
  uint64_t cursor;       /* ring position the next claim starts looking at */
  uint32_t owner_deaths; /* lock recoveries after a holder died */
  uint32_t reserved;
  pthread_mutex_t mutex; /* guards everything but magic, capacity, leaves */
};
_Static_assert(offsetof(struct beast_sumtree, magic) == 0,
               "the magic word starts the block (beast_block_valid)");

static size_t round_up(size_t n) {
  return (n + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE;
}

static uint32_t leaves_for(uint32_t capacity) {
  uint32_t p = 1;
  while (p < capacity)
    p <<= 1;
  return p;
}

static size_t sum_offset(void) {
  return round_up(sizeof(struct beast_sumtree));
}

static size_t max_offset(uint32_t leaves) {
  return sum_offset() + round_up(2 * (size_t)leaves * sizeof(double));
}

static size_t gen_offset(uint32_t leaves) {
  return max_offset(leaves) + round_up(2 * (size_t)leaves * sizeof(double));
}

static size_t writer_offset(uint32_t leaves, uint32_t capacity) {
  return gen_offset(leaves) + round_up((size_t)capacity * sizeof(uint64_t));
}

size_t beast_sumtree_nbytes(uint32_t capacity) {
  if (capacity == 0 || capacity > BEAST_SUMTREE_MAX_CAPACITY)
    return 0;
  return writer_offset(leaves_for(capacity), capacity) +
         round_up((size_t)capacity * sizeof(int32_t));
}

static double *sums(struct beast_sumtree *t) {
  return (double *)((char *)t + sum_offset());
}

static double *maxes(struct beast_sumtree *t) {
  return (double *)((char *)t + max_offset(t->leaves));
}

static uint64_t *gens(struct beast_sumtree *t) {
  return (uint64_t *)((char *)t + gen_offset(t->leaves));
}

static int32_t *writers(struct beast_sumtree *t) {
  return (int32_t *)((char *)t + writer_offset(t->leaves, t->capacity));
}

/* The header behind mem, or NULL if mem is not an initialised tree. */
static struct beast_sumtree *checked(void *mem) {
  if (!beast_block_valid(mem, _Alignof(struct beast_sumtree),
                         BEAST_SUMTREE_MAGIC))
    return NULL;
  struct beast_sumtree *t = mem;
  if (t->capacity == 0 || t->capacity > BEAST_SUMTREE_MAX_CAPACITY ||
      t->leaves != leaves_for(t->capacity))
    return NULL;
  return t;
}

/* Recompute node k from its children: the only way an internal node is ever
 * written, so each one is exactly the float64 sum of its children. */
static void pull(double *sum, double *max, uint32_t k) {
  sum[k] = sum[2 * k] + sum[2 * k + 1];
  max[k] = fmax(max[2 * k], max[2 * k + 1]);
}

static void rebuild(struct beast_sumtree *t) {
  double *sum = sums(t), *max = maxes(t);
  for (uint32_t k = t->leaves - 1; k >= 1; k--)
    pull(sum, max, k);
}

static int lock(struct beast_sumtree *t) {
  int recovered;
  int rc = beast_robust_mutex_lock(&t->mutex, &recovered);
  if (rc == BEAST_OK && recovered) {
    /* The dead holder may have written a leaf and propagated it only part of
     * the way up: rebuild every sum from the leaves. */
    t->owner_deaths++;
    rebuild(t);
  }
  return rc;
}

static void unlock(struct beast_sumtree *t) { pthread_mutex_unlock(&t->mutex); }

static void set_leaf(struct beast_sumtree *t, uint32_t i, double p) {
  double *sum = sums(t), *max = maxes(t);
  uint32_t k = t->leaves + i;
  sum[k] = p;
  max[k] = p;
  for (k /= 2; k >= 1; k /= 2)
    pull(sum, max, k);
}

int beast_sumtree_init(void *mem, size_t nbytes, uint32_t capacity) {
  /* Zeroed: all-zero bits are 0.0 priorities and generations. */
  const size_t align = _Alignof(struct beast_sumtree);
  int rc = beast_block_init(mem, nbytes, beast_sumtree_nbytes(capacity), align,
                            BEAST_SUMTREE_MAGIC);
  if (rc != BEAST_OK)
    return rc;
  struct beast_sumtree *t = mem;
  t->capacity = capacity;
  t->leaves = leaves_for(capacity);
  rc = beast_robust_mutex_init(&t->mutex);
  if (rc != BEAST_OK)
    return rc;
  beast_block_publish(mem, BEAST_SUMTREE_MAGIC);
  return BEAST_OK;
}

int beast_sumtree_capacity(void *mem, uint32_t *out) {
  struct beast_sumtree *t = checked(mem);
  if (t == NULL || out == NULL)
    return BEAST_EINVAL;
  *out = t->capacity;
  return BEAST_OK;
}

/* Whether priorities[0..n) are finite and >= 0 (isfinite also rejects NaN). */
static int valid_priorities(const double *priorities, uint32_t n) {
  if (n > 0 && priorities == NULL)
    return 0;
  for (uint32_t k = 0; k < n; k++)
    if (!isfinite(priorities[k]) || priorities[k] < 0.0)
      return 0;
  return 1;
}

/* The tree behind mem, locked, for a call on leaves indices[0..n): the
 * indices are checked before the lock and before any write, so a bad batch
 * (BEAST_EINVAL) changes nothing. */
static int lock_leaves(void *mem, const int64_t *indices, uint32_t n,
                       struct beast_sumtree **tree) {
  struct beast_sumtree *t = checked(mem);
  if (t == NULL || (n > 0 && indices == NULL))
    return BEAST_EINVAL;
  for (uint32_t k = 0; k < n; k++)
    if (indices[k] < 0 || indices[k] >= (int64_t)t->capacity)
      return BEAST_EINVAL;
  *tree = t;
  return lock(t);
}

int beast_sumtree_update(void *mem, const int64_t *indices,
                         const double *priorities, const uint64_t *generations,
                         uint32_t n, uint32_t *applied) {
  /* Checked before the lock and before any write: a bad batch changes
   * nothing. */
  if (!valid_priorities(priorities, n))
    return BEAST_EINVAL;
  struct beast_sumtree *t;
  int rc = lock_leaves(mem, indices, n, &t);
  if (rc != BEAST_OK)
    return rc;
  uint64_t *gen = gens(t);
  uint32_t count = 0;
  for (uint32_t k = 0; k < n; k++) {
    uint32_t i = (uint32_t)indices[k];
    if (generations != NULL && gen[i] != generations[k])
      continue;
    set_leaf(t, i, priorities[k]);
    count++;
  }
  unlock(t);
  if (applied != NULL)
    *applied = count;
  return BEAST_OK;
}

int beast_sumtree_get(void *mem, const int64_t *indices, uint32_t n,
                      double *priorities, uint64_t *generations) {
  struct beast_sumtree *t;
  int rc = lock_leaves(mem, indices, n, &t);
  if (rc != BEAST_OK)
    return rc;
  const double *sum = sums(t);
  const uint64_t *gen = gens(t);
  for (uint32_t k = 0; k < n; k++) {
    uint32_t i = (uint32_t)indices[k];
    if (priorities != NULL)
      priorities[k] = sum[t->leaves + i];
    if (generations != NULL)
      generations[k] = gen[i];
  }
  unlock(t);
  return BEAST_OK;
}

/* Draws descended together, one tree level at a time. A single descent is a
 * chain of dependent loads, each a likely cache miss in a large tree; a block
 * of independent descents lets the CPU keep that many misses in flight (on
 * 2^20 leaves, ~1.5x the draws per CPU-second of one draw at a time; blocks
 * of 64 were no better than 16). */
#define SAMPLE_BLOCK 16

/* One step of the descent from node *k with *target (0 <= target <= the
 * node's sum): go left when the target falls in the left child's mass, and
 * right otherwise (subtracting the left mass). A child with zero mass is
 * never entered: this matters when rounding leaves target >= the node's sum
 * (u = 1, or target - left landing a hair above right), and it is what
 * guarantees a leaf with positive priority. Requires a node sum > 0. */
static inline void descend_step(const double *sum, uint32_t *k,
                                double *target) {
  double left = sum[2 * *k], right = sum[2 * *k + 1];
  if (*target < left || right <= 0.0) {
    *k = 2 * *k;
  } else {
    *target -= left;
    *k = 2 * *k + 1;
  }
}

int beast_sumtree_sample(void *mem, const double *draws, uint32_t n,
                         int64_t *indices, uint64_t *generations,
                         double *priorities, double *total) {
  struct beast_sumtree *t = checked(mem);
  if (t == NULL || (n > 0 && (draws == NULL || indices == NULL)))
    return BEAST_EINVAL;
  for (uint32_t k = 0; k < n; k++)
    if (!(draws[k] >= 0.0 && draws[k] <= 1.0)) /* also rejects NaN */
      return BEAST_EINVAL;
  int rc = lock(t);
  if (rc != BEAST_OK)
    return rc;
  const double *sum = sums(t);
  const uint64_t *gen = gens(t);
  const double mass = sum[1];
  if (!(mass > 0.0)) {
    unlock(t);
    return BEAST_EEMPTY;
  }
  for (uint32_t base = 0; base < n; base += SAMPLE_BLOCK) {
    uint32_t m = n - base < SAMPLE_BLOCK ? n - base : SAMPLE_BLOCK;
    uint32_t node[SAMPLE_BLOCK];
    double target[SAMPLE_BLOCK];
    for (uint32_t j = 0; j < m; j++) {
      node[j] = 1;
      target[j] = draws[base + j] * mass;
    }
    /* Every leaf is at the same depth, log2(leaves). */
    for (uint32_t width = t->leaves; width > 1; width >>= 1)
      for (uint32_t j = 0; j < m; j++)
        descend_step(sum, &node[j], &target[j]);
    for (uint32_t j = 0; j < m; j++) {
      uint32_t i = node[j] - t->leaves;
      indices[base + j] = i;
      if (generations != NULL)
        generations[base + j] = gen[i];
      if (priorities != NULL)
        priorities[base + j] = sum[node[j]];
    }
  }
  unlock(t);
  if (total != NULL)
    *total = mass;
  return BEAST_OK;
}

/* A slot is free for a new claim unless a live process is still writing it:
 * two writers in one slot would interleave their rows into a sequence that
 * is neither (a writer descheduled mid-write while another laps the ring).
 * A writer that died mid-write frees its slot (its data stays unsampleable:
 * priority 0 until the next claim commits). */
static int slot_free(int32_t writer) {
  return writer == 0 || (kill(writer, 0) == -1 && errno == ESRCH);
}

int beast_sumtree_claim(void *mem, int64_t *index, uint64_t *generation) {
  struct beast_sumtree *t = checked(mem);
  if (t == NULL || index == NULL || generation == NULL)
    return BEAST_EINVAL;
  int rc = lock(t);
  if (rc != BEAST_OK)
    return rc;
  int32_t *writer = writers(t);
  uint32_t i = 0, tried = 0;
  for (; tried < t->capacity; tried++) {
    i = (uint32_t)(t->cursor % t->capacity);
    t->cursor++;
    if (slot_free(writer[i]))
      break;
  }
  if (tried == t->capacity) {
    unlock(t);
    return BEAST_EFULL;
  }
  /* Priority 0 first, so that a holder killed after this line leaves a slot
   * nobody samples (its data may be half-written) rather than one that is
   * sampled under its old generation. */
  set_leaf(t, i, 0.0);
  uint64_t g = ++gens(t)[i];
  writer[i] = (int32_t)getpid();
  t->claims++;
  unlock(t);
  *index = i;
  *generation = g;
  return BEAST_OK;
}

int beast_sumtree_commit(void *mem, int64_t index, uint64_t generation,
                         double priority, uint32_t *applied) {
  struct beast_sumtree *t = checked(mem);
  if (t == NULL || index < 0 || index >= (int64_t)t->capacity ||
      !valid_priorities(&priority, 1))
    return BEAST_EINVAL;
  int rc = lock(t);
  if (rc != BEAST_OK)
    return rc;
  uint32_t i = (uint32_t)index, count = 0;
  if (gens(t)[i] == generation) {
    set_leaf(t, i, priority);
    writers(t)[i] = 0;
    count = 1;
  }
  unlock(t);
  if (applied != NULL)
    *applied = count;
  return BEAST_OK;
}

int beast_sumtree_invalidate(void *mem, const int64_t *indices, uint32_t n,
                             uint64_t *generations) {
  struct beast_sumtree *t;
  int rc = lock_leaves(mem, indices, n, &t);
  if (rc != BEAST_OK)
    return rc;
  uint64_t *gen = gens(t);
  for (uint32_t k = 0; k < n; k++) {
    uint32_t i = (uint32_t)indices[k];
    set_leaf(t, i, 0.0);
    gen[i]++;
    if (generations != NULL)
      generations[k] = gen[i];
  }
  unlock(t);
  return BEAST_OK;
}

int beast_sumtree_stats(void *mem, struct beast_sumtree_stats *out) {
  struct beast_sumtree *t = checked(mem);
  if (t == NULL || out == NULL)
    return BEAST_EINVAL;
  int rc = lock(t);
  if (rc != BEAST_OK)
    return rc;
  out->total = sums(t)[1];
  out->max = maxes(t)[1];
  out->claims = t->claims;
  out->owner_deaths = t->owner_deaths;
  unlock(t);
  return BEAST_OK;
}

int beast_sumtree_export(void *mem, double *priorities, uint64_t *generations,
                         uint32_t capacity, uint64_t *claims,
                         uint64_t *cursor) {
  struct beast_sumtree *t = checked(mem);
  if (t == NULL || priorities == NULL || generations == NULL ||
      claims == NULL || cursor == NULL || capacity != t->capacity)
    return BEAST_EINVAL;
  int rc = lock(t);
  if (rc != BEAST_OK)
    return rc;
  /* The max tree's leaves equal the sum tree's (set_leaf writes both). */
  memcpy(priorities, sums(t) + t->leaves, (size_t)capacity * sizeof(double));
  memcpy(generations, gens(t), (size_t)capacity * sizeof(uint64_t));
  *claims = t->claims;
  *cursor = t->cursor;
  unlock(t);
  return BEAST_OK;
}

int beast_sumtree_restore(void *mem, const double *priorities,
                          const uint64_t *generations, uint32_t capacity,
                          uint64_t claims, uint64_t cursor) {
  struct beast_sumtree *t = checked(mem);
  /* capacity is immutable after init, so checking it (and the priorities)
   * before the lock, as update does, is the same as checking under it: a bad
   * state changes nothing. */
  if (t == NULL || generations == NULL || capacity != t->capacity ||
      !valid_priorities(priorities, capacity))
    return BEAST_EINVAL;
  int rc = lock(t);
  if (rc != BEAST_OK)
    return rc;
  double *sum = sums(t), *max = maxes(t);
  /* Leaves past capacity were zeroed at init and are never written. */
  memcpy(sum + t->leaves, priorities, (size_t)capacity * sizeof(double));
  memcpy(max + t->leaves, priorities, (size_t)capacity * sizeof(double));
  memcpy(gens(t), generations, (size_t)capacity * sizeof(uint64_t));
  /* pids of another run's writers (or of this one's, from before the
   * checkpoint) hold no slot now. */
  memset(writers(t), 0, (size_t)capacity * sizeof(int32_t));
  t->claims = claims;
  t->cursor = cursor;
  rebuild(t);
  unlock(t);
  return BEAST_OK;
}
