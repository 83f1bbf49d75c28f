/*
 * beast/native/batcher.c -- see batcher.h for the contract.
 *
 * Layout of the caller's block, every part a multiple of 64 bytes so that
 * words written by different processes do not share a cache line:
 *
 *   struct beast_batcher         header: sizes, closed flag (read-mostly)
 *   struct beast_batcher_totals  the stats counters (written by every call)
 *   struct beast_batcher_server  [num_servers]: futex word, waiters, range
 *   struct beast_batcher_group   [num_groups]: generation + pending, futex
 *   uint32_t slot[num_slots]     gen << 2 | EMPTY / READY / TAKEN
 *
 * There is no lock. A group's state is one 64-bit atomic, generation in the
 * high half and the number of unanswered requests (pending) in the low half;
 * a slot's state is one 32-bit atomic that also carries the generation it
 * was posted in. Each posted request leaves pending exactly once: through
 * the answer that moves its slot TAKEN -> EMPTY (credited only if the
 * generation still matches), or through reset_group, which starts a new
 * generation with pending 0. So an answer racing a reset can never make
 * pending underflow or wake the group's next actor early.
 *
 * Wake protocol (no lost wake-ups), used for both futex words: a sleeper
 * increments `waiters`, reads the futex word, checks its condition, then
 * futex-waits expecting the value it read. A waker changes the condition,
 * bumps the word, then reads `waiters` and issues FUTEX_WAKE only if it is
 * non-zero. All of these are seq_cst, so either the waker sees the sleeper
 * registered, or the sleeper sees the changed condition or the bumped word
 * (and its futex wait returns EAGAIN at once).
 */
#define _GNU_SOURCE
#include "batcher.h"

#include <stdlib.h>
#include <string.h>

/* "beastBT1" little-endian: identifies an initialised block. */
#define BEAST_BATCHER_MAGIC 0x3154427473616562ULL

#define CACHE_LINE 64

enum { SLOT_EMPTY = 0, SLOT_READY = 1, SLOT_TAKEN = 2 };
#define SLOT_STATE_MASK 3u
/* A slot keeps the low 30 bits of its generation above its 2 state bits. */
#define SLOT_GEN_MASK 0x3fffffffu

struct beast_batcher {
  uint64_t magic;       /* BEAST_BATCHER_MAGIC once initialised */
  uint32_t num_groups;  /* immutable after init, like the next three */
  uint32_t group_size;  /* K: slots per group */
  uint32_t num_servers; /* servers the groups are split between */
  uint32_t num_slots;   /* num_groups * group_size */
  uint32_t closed;      /* 0 or 1 */
  uint32_t reserved[9];
};
_Static_assert(offsetof(struct beast_batcher, magic) == 0,
               "the magic word starts the block (beast_block_valid)");

struct beast_batcher_totals {
  uint64_t posted, answered, dropped, stale; /* see beast_batcher_stats */
  uint64_t reserved[4];
};

struct beast_batcher_server {
  uint32_t seq;     /* futex word: bumped by every post into this range and
                       by close */
  uint32_t waiters; /* collect calls registered to sleep; a dead one
                       overcounts, which only costs a spare wake syscall */
  uint32_t cursor;  /* group (relative to lo) where the next scan starts */
  uint32_t lo, hi;  /* immutable: groups [lo, hi) */
  uint32_t reserved[11];
};

struct beast_batcher_group {
  uint64_t state;   /* generation << 32 | pending */
  uint32_t seq;     /* futex word: bumped when pending reaches 0, on reset
                       and on close */
  uint32_t waiters; /* wait_answered calls registered to sleep */
  uint32_t server;  /* immutable: the server whose range holds this group */
  uint32_t reserved[11];
};

_Static_assert(sizeof(struct beast_batcher) == CACHE_LINE, "header line");
_Static_assert(sizeof(struct beast_batcher_totals) == CACHE_LINE, "totals");
_Static_assert(sizeof(struct beast_batcher_server) == CACHE_LINE, "server");
_Static_assert(sizeof(struct beast_batcher_group) == CACHE_LINE, "group");

static size_t servers_offset(void) {
  return sizeof(struct beast_batcher) + sizeof(struct beast_batcher_totals);
}

static size_t groups_offset(uint32_t num_servers) {
  return servers_offset() +
         (size_t)num_servers * sizeof(struct beast_batcher_server);
}

static size_t slots_offset(uint32_t num_servers, uint32_t num_groups) {
  return groups_offset(num_servers) +
         (size_t)num_groups * sizeof(struct beast_batcher_group);
}

static struct beast_batcher_totals *totals(struct beast_batcher *b) {
  return (struct beast_batcher_totals *)((char *)b + sizeof(*b));
}

static struct beast_batcher_server *server_at(struct beast_batcher *b,
                                              uint32_t i) {
  return (struct beast_batcher_server *)((char *)b + servers_offset()) + i;
}

static struct beast_batcher_group *group_at(struct beast_batcher *b,
                                            uint32_t g) {
  return (struct beast_batcher_group *)((char *)b +
                                        groups_offset(b->num_servers)) +
         g;
}

static uint32_t *slots(struct beast_batcher *b) {
  return (uint32_t *)((char *)b + slots_offset(b->num_servers, b->num_groups));
}

static uint32_t pending_of(uint64_t state) { return (uint32_t)state; }
static uint32_t gen_of(uint64_t state) { return (uint32_t)(state >> 32); }

static uint32_t slot_word(uint32_t gen, uint32_t slot_state) {
  return (gen & SLOT_GEN_MASK) << 2 | slot_state;
}

static int valid_sizes(uint32_t num_groups, uint32_t group_size,
                       uint32_t num_servers) {
  return num_groups > 0 && group_size > 0 && num_servers > 0 &&
         num_servers <= num_groups &&
         (uint64_t)num_groups * group_size <= BEAST_BATCHER_MAX_SLOTS;
}

size_t beast_batcher_nbytes(uint32_t num_groups, uint32_t group_size,
                            uint32_t num_servers) {
  if (!valid_sizes(num_groups, group_size, num_servers))
    return 0;
  size_t n = slots_offset(num_servers, num_groups) +
             (size_t)num_groups * group_size * sizeof(uint32_t);
  return (n + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE;
}

/* The header behind mem, or NULL if mem is not an initialised table. Cannot
 * catch every bad pointer (an unmapped one still faults), only null,
 * misaligned, never-initialised or overwritten blocks. */
static struct beast_batcher *checked(void *mem) {
  if (!beast_block_valid(mem, 8, BEAST_BATCHER_MAGIC))
    return NULL;
  struct beast_batcher *b = mem;
  if (!valid_sizes(b->num_groups, b->group_size, b->num_servers) ||
      b->num_slots != b->num_groups * b->group_size)
    return NULL;
  return b;
}

static int is_closed(struct beast_batcher *b) {
  return __atomic_load_n(&b->closed, __ATOMIC_SEQ_CST) != 0;
}

/* Bump a futex word and wake its sleepers, skipping the syscall when none is
 * registered (see the wake protocol above). */
static void bump_and_wake(uint32_t *seq, uint32_t *waiters) {
  __atomic_add_fetch(seq, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(waiters, __ATOMIC_SEQ_CST) > 0)
    beast_futex_wake(seq, INT_MAX);
}

int beast_batcher_init(void *mem, size_t nbytes, uint32_t num_groups,
                       uint32_t group_size, uint32_t num_servers) {
  size_t need = beast_batcher_nbytes(num_groups, group_size, num_servers);
  int rc = beast_block_init(mem, nbytes, need, 8, BEAST_BATCHER_MAGIC);
  if (rc != BEAST_OK)
    return rc;
  struct beast_batcher *b = mem;
  b->num_groups = num_groups;
  b->group_size = group_size;
  b->num_servers = num_servers;
  b->num_slots = num_groups * group_size;
  for (uint32_t i = 0; i < num_servers; i++) {
    struct beast_batcher_server *srv = server_at(b, i);
    srv->lo = (uint32_t)((uint64_t)i * num_groups / num_servers);
    srv->hi = (uint32_t)((uint64_t)(i + 1) * num_groups / num_servers);
    for (uint32_t g = srv->lo; g < srv->hi; g++)
      group_at(b, g)->server = i;
  }
  beast_block_publish(mem, BEAST_BATCHER_MAGIC);
  return BEAST_OK;
}

int beast_batcher_sizes(void *mem, uint32_t *num_groups, uint32_t *group_size,
                        uint32_t *num_servers) {
  struct beast_batcher *b = checked(mem);
  if (b == NULL)
    return BEAST_EINVAL;
  if (num_groups != NULL)
    *num_groups = b->num_groups;
  if (group_size != NULL)
    *group_size = b->group_size;
  if (num_servers != NULL)
    *num_servers = b->num_servers;
  return BEAST_OK;
}

int beast_batcher_server_groups(void *mem, uint32_t server, uint32_t *lo,
                                uint32_t *hi) {
  struct beast_batcher *b = checked(mem);
  if (b == NULL || server >= b->num_servers || lo == NULL || hi == NULL)
    return BEAST_EINVAL;
  *lo = server_at(b, server)->lo;
  *hi = server_at(b, server)->hi;
  return BEAST_OK;
}

int beast_batcher_post(void *mem, uint32_t group, uint32_t count) {
  struct beast_batcher *b = checked(mem);
  if (b == NULL || group >= b->num_groups || count == 0 ||
      count > b->group_size)
    return BEAST_EINVAL;
  if (is_closed(b))
    return BEAST_ECLOSED;
  struct beast_batcher_group *grp = group_at(b, group);
  uint64_t state = __atomic_load_n(&grp->state, __ATOMIC_ACQUIRE);
  if (pending_of(state) != 0)
    return BEAST_EFULL;
  uint32_t gen = gen_of(state);
  /* Pending is raised before any slot turns READY, so it never counts fewer
   * requests than are outstanding: an answer cannot reach 0 early. A failed
   * exchange means another caller posted or reset this group concurrently,
   * which the contract forbids; report it as "still pending". */
  if (!__atomic_compare_exchange_n(&grp->state, &state,
                                   (uint64_t)gen << 32 | count, 0,
                                   __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE))
    return BEAST_EFULL;
  /* Release: the caller's inputs for these slots are visible to whichever
   * server takes the slot (its compare-exchange acquires). An actor dying
   * between these stores leaves some slots READY; reset_group cleans up. */
  uint32_t *slot = slots(b) + (size_t)group * b->group_size;
  const uint32_t ready = slot_word(gen, SLOT_READY);
  for (uint32_t k = 0; k < count; k++)
    __atomic_store_n(&slot[k], ready, __ATOMIC_RELEASE);
  __atomic_add_fetch(&totals(b)->posted, count, __ATOMIC_RELAXED);
  struct beast_batcher_server *srv = server_at(b, grp->server);
  bump_and_wake(&srv->seq, &srv->waiters);
  return BEAST_OK;
}

int beast_batcher_wait_answered(void *mem, uint32_t group, int64_t timeout_ns) {
  struct beast_batcher *b = checked(mem);
  if (b == NULL || group >= b->num_groups)
    return BEAST_EINVAL;
  struct beast_batcher_group *grp = group_at(b, group);
  struct timespec deadline;
  const struct timespec *until = beast_wait_deadline(timeout_ns, &deadline);
  __atomic_add_fetch(&grp->waiters, 1, __ATOMIC_SEQ_CST);
  int rc;
  for (;;) {
    uint32_t seen = __atomic_load_n(&grp->seq, __ATOMIC_SEQ_CST);
    if (is_closed(b)) {
      rc = BEAST_ECLOSED;
      break;
    }
    /* Acquire (seq_cst): the outputs the server wrote before answering are
     * visible to the caller once it sees pending reach 0. */
    if (pending_of(__atomic_load_n(&grp->state, __ATOMIC_SEQ_CST)) == 0) {
      rc = BEAST_OK;
      break;
    }
    /* Checked after the condition: a waiter woken at its deadline still
     * returns OK for an answer that arrived in time. */
    if (beast_wait_over(timeout_ns, until)) {
      rc = BEAST_ETIMEDOUT;
      break;
    }
    int err = beast_futex_wait(&grp->seq, seen, until);
    /* 0: woken; EAGAIN: seq moved before we slept; ETIMEDOUT: re-check once,
     * then report the timeout. All three loop. */
    if (err == 0 || err == EAGAIN || err == ETIMEDOUT)
      continue;
    /* EINTR goes back to the caller so that a Python signal handler
     * (KeyboardInterrupt) can run before the retry. */
    rc = err == EINTR ? BEAST_EINTR : BEAST_ESYS;
    break;
  }
  __atomic_sub_fetch(&grp->waiters, 1, __ATOMIC_SEQ_CST);
  return rc;
}

/* Take READY slots of srv's groups into out[n..max), starting at the cursor
 * that the last full batch left; returns the new n. */
static uint32_t scan(struct beast_batcher *b, struct beast_batcher_server *srv,
                     int64_t *out, uint32_t n, uint32_t max) {
  const uint32_t count = srv->hi - srv->lo, k_size = b->group_size;
  uint32_t *all = slots(b);
  uint32_t start = __atomic_load_n(&srv->cursor, __ATOMIC_RELAXED);
  if (start >= count)
    start = 0;
  for (uint32_t j = 0; j < count; j++) {
    uint32_t rel = start + j < count ? start + j : start + j - count;
    uint32_t g = srv->lo + rel;
    /* A group with nothing pending has no READY slot: skip its K words. */
    if (pending_of(__atomic_load_n(&group_at(b, g)->state, __ATOMIC_ACQUIRE)) ==
        0)
      continue;
    uint32_t *slot = all + (size_t)g * k_size;
    for (uint32_t k = 0; k < k_size; k++) {
      uint32_t word = __atomic_load_n(&slot[k], __ATOMIC_RELAXED);
      if ((word & SLOT_STATE_MASK) != SLOT_READY)
        continue;
      /* Acquire pairs with post's release: the inputs are visible. Losing
       * the race (another collector, or reset_group) just skips the slot. */
      uint32_t taken = (word & ~SLOT_STATE_MASK) | SLOT_TAKEN;
      if (!__atomic_compare_exchange_n(&slot[k], &word, taken, 0,
                                       __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        continue;
      out[n++] = (int64_t)g * k_size + k;
      if (n == max) {
        /* Round robin: the next scan starts at the group after this one, so
         * an actor that reposts at once cannot starve the others; or at this
         * group again if it still has READY slots (a batch split it). */
        uint32_t next = rel + 1 < count ? rel + 1 : 0;
        for (uint32_t rest = k + 1; rest < k_size; rest++)
          if ((__atomic_load_n(&slot[rest], __ATOMIC_RELAXED) &
               SLOT_STATE_MASK) == SLOT_READY) {
            next = rel;
            break;
          }
        __atomic_store_n(&srv->cursor, next, __ATOMIC_RELAXED);
        return n;
      }
    }
  }
  return n;
}

static int compare_int64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

int beast_batcher_collect(void *mem, uint32_t server, int64_t *out,
                          uint32_t max_batch, uint32_t min_batch,
                          int64_t timeout_ns, int64_t window_ns,
                          uint32_t *n_out) {
  struct beast_batcher *b = checked(mem);
  if (n_out != NULL)
    *n_out = 0;
  if (b == NULL || server >= b->num_servers || out == NULL || n_out == NULL ||
      min_batch == 0 || min_batch > max_batch)
    return BEAST_EINVAL;
  struct beast_batcher_server *srv = server_at(b, server);
  /* A batch can never exceed the server's slots: cap both bounds there so
   * that "wait until max_batch" ends once every slot is taken. */
  const uint32_t range_slots = (srv->hi - srv->lo) * b->group_size;
  if (max_batch > range_slots)
    max_batch = range_slots;
  if (min_batch > max_batch)
    min_batch = max_batch;

  struct timespec first_deadline, window_end;
  const struct timespec *first_until =
      beast_wait_deadline(timeout_ns, &first_deadline);
  uint32_t n = 0;
  int window_open = 0; /* whether window_end is set (n > 0) */
  int rc;
  __atomic_add_fetch(&srv->waiters, 1, __ATOMIC_SEQ_CST);
  for (;;) {
    uint32_t seen = __atomic_load_n(&srv->seq, __ATOMIC_SEQ_CST);
    if (is_closed(b)) {
      rc = BEAST_ECLOSED;
      break;
    }
    n = scan(b, srv, out, n, max_batch);
    if (n == max_batch || (n > 0 && n >= min_batch)) {
      rc = BEAST_OK;
      break;
    }
    const struct timespec *until;
    if (n == 0) {
      if (beast_wait_over(timeout_ns, first_until)) {
        rc = BEAST_ETIMEDOUT;
        break;
      }
      until = first_until;
    } else {
      /* The batching window runs from when the first request was taken. */
      if (!window_open) {
        if (window_ns <= 0) {
          rc = BEAST_OK;
          break;
        }
        window_end = beast_deadline_after(window_ns);
        window_open = 1;
      } else if (beast_deadline_passed(&window_end)) {
        rc = BEAST_OK;
        break;
      }
      until = &window_end;
    }
    int err = beast_futex_wait(&srv->seq, seen, until);
    if (err == 0 || err == EAGAIN || err == ETIMEDOUT)
      continue;
    /* A signal: with requests in hand, end the window early and return them
     * (they must not be lost); with none, let the caller's handler run. */
    if (n > 0)
      rc = BEAST_OK;
    else
      rc = err == EINTR ? BEAST_EINTR : BEAST_ESYS;
    break;
  }
  __atomic_sub_fetch(&srv->waiters, 1, __ATOMIC_SEQ_CST);
  if (rc != BEAST_OK)
    return rc;
  /* Ascending indices keep the caller's index_select and scatter local. */
  qsort(out, n, sizeof(int64_t), compare_int64);
  *n_out = n;
  return BEAST_OK;
}

/* Credit `count` answers of generation `gen` to group g; wake it at 0. */
static void credit(struct beast_batcher *b, uint32_t g, uint32_t gen,
                   uint32_t count) {
  struct beast_batcher_group *grp = group_at(b, g);
  uint64_t state = __atomic_load_n(&grp->state, __ATOMIC_RELAXED);
  uint64_t next;
  do {
    /* A reset since the post: these answers belong to a dead actor. The
     * pending check is defensive; the protocol never trips it. */
    if ((gen_of(state) & SLOT_GEN_MASK) != gen || pending_of(state) < count) {
      __atomic_add_fetch(&totals(b)->stale, count, __ATOMIC_RELAXED);
      return;
    }
    next = state - count;
    /* Release (seq_cst): the outputs written before answer are visible to
     * the actor that sees pending reach 0. */
  } while (!__atomic_compare_exchange_n(&grp->state, &state, next, 0,
                                        __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  __atomic_add_fetch(&totals(b)->answered, count, __ATOMIC_RELAXED);
  if (pending_of(next) == 0)
    bump_and_wake(&grp->seq, &grp->waiters);
}

int beast_batcher_answer(void *mem, const int64_t *indices, uint32_t n) {
  struct beast_batcher *b = checked(mem);
  if (b == NULL || (indices == NULL && n > 0))
    return BEAST_EINVAL;
  /* Validate everything first so that a bad call changes nothing. */
  for (uint32_t i = 0; i < n; i++)
    if (indices[i] < 0 || indices[i] >= (int64_t)b->num_slots)
      return BEAST_EINVAL;
  uint32_t *all = slots(b);
  /* Consecutive answers to one group and generation (the usual case: a
   * sorted batch holds whole groups) are credited with one atomic. */
  uint32_t run_group = 0, run_gen = 0, run_count = 0;
  uint64_t stale = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t index = (uint32_t)indices[i];
    uint32_t word = __atomic_load_n(&all[index], __ATOMIC_RELAXED);
    int took = 0;
    while ((word & SLOT_STATE_MASK) == SLOT_TAKEN) {
      if (__atomic_compare_exchange_n(&all[index], &word,
                                      word & ~SLOT_STATE_MASK, 0,
                                      __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
        took = 1;
        break;
      }
    }
    if (!took) {
      stale++; /* reset_group dropped it (or it was never collected) */
      continue;
    }
    uint32_t g = index / b->group_size, gen = word >> 2;
    if (run_count > 0 && (g != run_group || gen != run_gen)) {
      credit(b, run_group, run_gen, run_count);
      run_count = 0;
    }
    run_group = g;
    run_gen = gen;
    run_count++;
  }
  if (run_count > 0)
    credit(b, run_group, run_gen, run_count);
  if (stale > 0)
    __atomic_add_fetch(&totals(b)->stale, stale, __ATOMIC_RELAXED);
  return BEAST_OK;
}

int beast_batcher_reset_group(void *mem, uint32_t group) {
  struct beast_batcher *b = checked(mem);
  if (b == NULL || group >= b->num_groups)
    return BEAST_EINVAL;
  struct beast_batcher_group *grp = group_at(b, group);
  /* New generation first, pending 0: from here on an answer to a slot taken
   * before the reset is stale, whenever it lands. */
  uint64_t state = __atomic_load_n(&grp->state, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(&grp->state, &state,
                                      (uint64_t)(gen_of(state) + 1) << 32, 0,
                                      __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
    ;
  uint32_t *slot = slots(b) + (size_t)group * b->group_size;
  uint64_t dropped = 0;
  for (uint32_t k = 0; k < b->group_size; k++) {
    uint32_t old = __atomic_exchange_n(&slot[k], SLOT_EMPTY, __ATOMIC_SEQ_CST);
    if ((old & SLOT_STATE_MASK) != SLOT_EMPTY)
      dropped++;
  }
  if (dropped > 0)
    __atomic_add_fetch(&totals(b)->dropped, dropped, __ATOMIC_RELAXED);
  bump_and_wake(&grp->seq, &grp->waiters);
  return BEAST_OK;
}

int beast_batcher_pending(void *mem, uint32_t group, uint32_t *out) {
  struct beast_batcher *b = checked(mem);
  if (b == NULL || group >= b->num_groups || out == NULL)
    return BEAST_EINVAL;
  *out =
      pending_of(__atomic_load_n(&group_at(b, group)->state, __ATOMIC_ACQUIRE));
  return BEAST_OK;
}

int beast_batcher_close(void *mem) {
  struct beast_batcher *b = checked(mem);
  if (b == NULL)
    return BEAST_EINVAL;
  __atomic_store_n(&b->closed, 1, __ATOMIC_SEQ_CST);
  for (uint32_t i = 0; i < b->num_servers; i++) {
    struct beast_batcher_server *srv = server_at(b, i);
    bump_and_wake(&srv->seq, &srv->waiters);
  }
  for (uint32_t g = 0; g < b->num_groups; g++) {
    struct beast_batcher_group *grp = group_at(b, g);
    bump_and_wake(&grp->seq, &grp->waiters);
  }
  return BEAST_OK;
}

int beast_batcher_stats(void *mem, struct beast_batcher_stats *out) {
  struct beast_batcher *b = checked(mem);
  if (b == NULL || out == NULL)
    return BEAST_EINVAL;
  struct beast_batcher_totals *t = totals(b);
  out->posted = __atomic_load_n(&t->posted, __ATOMIC_RELAXED);
  out->answered = __atomic_load_n(&t->answered, __ATOMIC_RELAXED);
  out->dropped = __atomic_load_n(&t->dropped, __ATOMIC_RELAXED);
  out->stale = __atomic_load_n(&t->stale, __ATOMIC_RELAXED);
  return BEAST_OK;
}
