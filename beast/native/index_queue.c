/*
 * beast/native/index_queue.c -- see index_queue.h for the contract.
 *
 * Layout of the caller's block: a struct beast_queue header followed by
 * int32_t data[capacity], a ring indexed by two monotonically increasing
 * 64-bit counters (head: values ever popped, tail: values ever pushed), so
 * size is tail - head and there is no full/empty ambiguity.
 *
 * Wake protocol (no lost wake-ups): a getter that finds the queue empty reads
 * `seq` and registers in `nwaiters` while holding the lock, unlocks, then
 * futex-waits on `seq` expecting the value it read. Every put and close bumps
 * `seq` under the lock, so a put landing between the getter's unlock and its
 * sleep makes the futex return EAGAIN at once instead of sleeping.
 */
#define _GNU_SOURCE
#include "index_queue.h"

#include <string.h>

/* "beastIQ1" little-endian: identifies an initialised block. */
#define BEAST_QUEUE_MAGIC 0x3151497473616562ULL

struct beast_queue {
  uint64_t magic;    /* BEAST_QUEUE_MAGIC once initialised */
  uint32_t capacity; /* immutable after init */
  uint32_t closed;   /* 0 or 1 */
  uint64_t head;     /* values ever popped; next read is data[head % cap] */
  uint64_t tail;     /* values ever pushed; next write is data[tail % cap] */
  uint32_t seq;      /* futex word: bumped on every put, close, recovery */
  uint32_t nwaiters; /* getters registered to sleep; a dead one overcounts,
                        which only costs a spare wake syscall */
  uint32_t owner_deaths; /* lock recoveries after a holder died */
  uint32_t reserved;
  pthread_mutex_t mutex; /* guards every field above except magic/capacity */
  int32_t data[];        /* the ring, capacity entries */
};
_Static_assert(offsetof(struct beast_queue, magic) == 0,
               "the magic word starts the block (beast_block_valid)");

size_t beast_queue_nbytes(uint32_t capacity) {
  if (capacity == 0 || capacity > BEAST_QUEUE_MAX_CAPACITY)
    return 0;
  size_t n =
      offsetof(struct beast_queue, data) + (size_t)capacity * sizeof(int32_t);
  /* Round up so that queues can be packed back to back in one block. */
  const size_t align = _Alignof(struct beast_queue);
  return (n + align - 1) / align * align;
}

/* The header behind mem, or NULL if mem is not an initialised queue. Cannot
 * catch every bad pointer (an unmapped one still faults), only null,
 * misaligned, never-initialised or overwritten blocks. */
static struct beast_queue *checked(void *mem) {
  if (!beast_block_valid(mem, _Alignof(struct beast_queue), BEAST_QUEUE_MAGIC))
    return NULL;
  struct beast_queue *q = mem;
  if (q->capacity == 0 || q->capacity > BEAST_QUEUE_MAX_CAPACITY)
    return NULL;
  return q;
}

static int lock(struct beast_queue *q) {
  int recovered;
  int rc = beast_robust_mutex_lock(&q->mutex, &recovered);
  if (rc == BEAST_OK && recovered) {
    /* The previous holder died inside a queue call. Every call writes a value
     * before publishing the counter that exposes it, so the ring is
     * consistent; at worst the one value it was moving is lost. It may have
     * died after changing the queue but before waking anyone, so bump seq and
     * wake every sleeper to re-check. */
    q->owner_deaths++;
    __atomic_store_n(&q->seq, q->seq + 1, __ATOMIC_RELEASE);
    beast_futex_wake(&q->seq, INT_MAX);
  }
  return rc;
}

static void unlock(struct beast_queue *q) { pthread_mutex_unlock(&q->mutex); }

int beast_queue_init(void *mem, size_t nbytes, uint32_t capacity) {
  int rc = beast_block_init(mem, nbytes, beast_queue_nbytes(capacity),
                            _Alignof(struct beast_queue), BEAST_QUEUE_MAGIC);
  if (rc != BEAST_OK)
    return rc;
  struct beast_queue *q = mem;
  q->capacity = capacity;
  rc = beast_robust_mutex_init(&q->mutex);
  if (rc != BEAST_OK)
    return rc;
  beast_block_publish(mem, BEAST_QUEUE_MAGIC);
  return BEAST_OK;
}

static int valid_mark_target(int32_t value, const int64_t *marks,
                             uint32_t n_marks) {
  return marks == NULL || (value >= 0 && (uint32_t)value < n_marks);
}

static int put_impl(void *mem, int32_t value, int64_t *marks, uint32_t n_marks,
                    int64_t mark) {
  struct beast_queue *q = checked(mem);
  if (q == NULL || !valid_mark_target(value, marks, n_marks))
    return BEAST_EINVAL;
  int rc = lock(q);
  if (rc != BEAST_OK)
    return rc;
  if (q->closed) {
    unlock(q);
    return BEAST_ECLOSED;
  }
  if (q->tail - q->head >= q->capacity) {
    unlock(q);
    return BEAST_EFULL;
  }
  q->data[q->tail % q->capacity] = value;
  /* Release: the value is stored before tail exposes it, so a holder killed
   * between the two lines loses this value and nothing else. */
  __atomic_store_n(&q->tail, q->tail + 1, __ATOMIC_RELEASE);
  /* After the push: a holder killed between the two lines leaves the value
   * queued and still marked, which reclaim resolves (header). */
  if (marks != NULL)
    __atomic_store_n(&marks[value], mark, __ATOMIC_RELEASE);
  __atomic_store_n(&q->seq, q->seq + 1, __ATOMIC_RELEASE);
  uint32_t waiters = q->nwaiters;
  unlock(q);
  /* One value, one wake. Skipping the syscall when nobody sleeps keeps the
   * common case (a non-empty free queue) free of kernel calls. */
  if (waiters > 0)
    beast_futex_wake(&q->seq, 1);
  return BEAST_OK;
}

int beast_queue_put(void *mem, int32_t value) {
  return put_impl(mem, value, NULL, 0, 0);
}

int beast_queue_put_marked(void *mem, int32_t value, int64_t *marks,
                           uint32_t n_marks, int64_t mark) {
  if (marks == NULL)
    return BEAST_EINVAL;
  return put_impl(mem, value, marks, n_marks, mark);
}

static int get_impl(void *mem, int32_t *out, int64_t timeout_ns,
                    int64_t *marks, uint32_t n_marks, int64_t mark) {
  struct beast_queue *q = checked(mem);
  if (q == NULL || out == NULL)
    return BEAST_EINVAL;
  struct timespec deadline;
  const struct timespec *until = beast_wait_deadline(timeout_ns, &deadline);

  int registered = 0; /* whether this call counts in q->nwaiters */
  for (;;) {
    int rc = lock(q);
    if (rc != BEAST_OK)
      return rc;
    if (registered) {
      if (q->nwaiters > 0)
        q->nwaiters--;
      registered = 0;
    }
    if (q->closed) {
      unlock(q);
      return BEAST_ECLOSED;
    }
    if (q->tail != q->head) {
      int32_t value = q->data[q->head % q->capacity];
      if (!valid_mark_target(value, marks, n_marks)) {
        unlock(q);
        return BEAST_EINVAL;
      }
      /* Before the pop: a holder killed between the two lines leaves the
       * value queued and already marked, which reclaim resolves (header). */
      if (marks != NULL)
        __atomic_store_n(&marks[value], mark, __ATOMIC_RELEASE);
      __atomic_store_n(&q->head, q->head + 1, __ATOMIC_RELEASE);
      /* Pass the wake on if values remain and others sleep: this repairs the
       * case where the waiter a put woke died before taking its value. */
      int pass_on = q->tail != q->head && q->nwaiters > 0;
      unlock(q);
      if (pass_on)
        beast_futex_wake(&q->seq, 1);
      *out = value;
      return BEAST_OK;
    }
    /* Checked only after the queue: a waiter woken at its deadline still
     * takes a value that arrived in time. */
    if (beast_wait_over(timeout_ns, until)) {
      unlock(q);
      return BEAST_ETIMEDOUT;
    }
    uint32_t seen = q->seq;
    q->nwaiters++;
    registered = 1;
    unlock(q);

    int err = beast_futex_wait(&q->seq, seen, until);
    /* 0: woken; EAGAIN: seq moved before we slept; ETIMEDOUT: re-check once
     * under the lock, then report the timeout. All three loop. */
    if (err == 0 || err == EAGAIN || err == ETIMEDOUT)
      continue;
    if (lock(q) == BEAST_OK) {
      if (q->nwaiters > 0)
        q->nwaiters--;
      unlock(q);
    }
    /* EINTR goes back to the caller rather than retrying here, so that a
     * Python signal handler (KeyboardInterrupt) can run before the retry. */
    return err == EINTR ? BEAST_EINTR : BEAST_ESYS;
  }
}

int beast_queue_get(void *mem, int32_t *out, int64_t timeout_ns) {
  return get_impl(mem, out, timeout_ns, NULL, 0, 0);
}

int beast_queue_get_marked(void *mem, int32_t *out, int64_t timeout_ns,
                           int64_t *marks, uint32_t n_marks, int64_t mark) {
  if (marks == NULL)
    return BEAST_EINVAL;
  return get_impl(mem, out, timeout_ns, marks, n_marks, mark);
}

/* Whether `value` is queued in q; the caller holds q's lock. */
static int queued(const struct beast_queue *q, int32_t value) {
  for (uint64_t i = q->head; i != q->tail; i++)
    if (q->data[i % q->capacity] == value)
      return 1;
  return 0;
}

int beast_queue_reclaim(void *free_mem, void *full_mem, int64_t *marks,
                        uint32_t n_marks, int32_t value, int64_t owner,
                        int32_t *returned) {
  struct beast_queue *free_q = checked(free_mem), *full_q = checked(full_mem);
  if (free_q == NULL || full_q == NULL || free_q == full_q || marks == NULL ||
      returned == NULL || !valid_mark_target(value, marks, n_marks) ||
      owner == BEAST_NO_OWNER)
    return BEAST_EINVAL;
  *returned = 0;
  /* Full first, always: the only call that holds two queue locks. */
  int rc = lock(full_q);
  if (rc != BEAST_OK)
    return rc;
  rc = lock(free_q);
  if (rc != BEAST_OK) {
    unlock(full_q);
    return rc;
  }
  int wake = 0;
  if (free_q->closed) {
    rc = BEAST_ECLOSED;
  } else if (__atomic_load_n(&marks[value], __ATOMIC_ACQUIRE) == owner) {
    if (!queued(full_q, value) && !queued(free_q, value)) {
      if (free_q->tail - free_q->head >= free_q->capacity) {
        rc = BEAST_EFULL;
      } else {
        free_q->data[free_q->tail % free_q->capacity] = value;
        __atomic_store_n(&free_q->tail, free_q->tail + 1, __ATOMIC_RELEASE);
        __atomic_store_n(&free_q->seq, free_q->seq + 1, __ATOMIC_RELEASE);
        wake = free_q->nwaiters > 0;
        *returned = 1;
      }
    }
    if (rc == BEAST_OK)
      __atomic_store_n(&marks[value], (int64_t)BEAST_NO_OWNER,
                       __ATOMIC_RELEASE);
  }
  unlock(free_q);
  unlock(full_q);
  if (wake)
    beast_futex_wake(&free_q->seq, 1);
  return rc;
}

int beast_queue_snapshot(void *mem, int32_t *out, uint32_t room,
                         uint32_t *n_out) {
  struct beast_queue *q = checked(mem);
  if (q == NULL || n_out == NULL || (out == NULL && room > 0))
    return BEAST_EINVAL;
  int rc = lock(q);
  if (rc != BEAST_OK)
    return rc;
  uint32_t n = (uint32_t)(q->tail - q->head);
  for (uint32_t i = 0; i < n && i < room; i++)
    out[i] = q->data[(q->head + i) % q->capacity];
  unlock(q);
  *n_out = n;
  return BEAST_OK;
}

int beast_queue_close(void *mem) {
  struct beast_queue *q = checked(mem);
  if (q == NULL)
    return BEAST_EINVAL;
  int rc = lock(q);
  /* Close even if the lock is unusable: shutdown must still wake everyone. */
  __atomic_store_n(&q->closed, 1, __ATOMIC_RELEASE);
  __atomic_add_fetch(&q->seq, 1, __ATOMIC_RELEASE);
  if (rc == BEAST_OK)
    unlock(q);
  beast_futex_wake(&q->seq, INT_MAX);
  return rc;
}

int beast_queue_size(void *mem, uint32_t *out) {
  struct beast_queue *q = checked(mem);
  if (q == NULL || out == NULL)
    return BEAST_EINVAL;
  int rc = lock(q);
  if (rc != BEAST_OK)
    return rc;
  *out = (uint32_t)(q->tail - q->head);
  unlock(q);
  return BEAST_OK;
}

int beast_queue_capacity(void *mem, uint32_t *out) {
  struct beast_queue *q = checked(mem);
  if (q == NULL || out == NULL)
    return BEAST_EINVAL;
  *out = q->capacity;
  return BEAST_OK;
}

int beast_queue_owner_deaths(void *mem, uint32_t *out) {
  struct beast_queue *q = checked(mem);
  if (q == NULL || out == NULL)
    return BEAST_EINVAL;
  *out = __atomic_load_n(&q->owner_deaths, __ATOMIC_ACQUIRE);
  return BEAST_OK;
}
