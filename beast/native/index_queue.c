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
  if (mem == NULL || (uintptr_t)mem % _Alignof(struct beast_queue) != 0)
    return NULL;
  struct beast_queue *q = mem;
  if (__atomic_load_n(&q->magic, __ATOMIC_ACQUIRE) != BEAST_QUEUE_MAGIC)
    return NULL;
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
  size_t need = beast_queue_nbytes(capacity);
  if (mem == NULL || need == 0 || nbytes < need ||
      (uintptr_t)mem % _Alignof(struct beast_queue) != 0)
    return BEAST_EINVAL;
  struct beast_queue *q = mem;
  /* Re-initialising a live queue would strand its users. */
  if (__atomic_load_n(&q->magic, __ATOMIC_ACQUIRE) == BEAST_QUEUE_MAGIC)
    return BEAST_EINVAL;
  memset(mem, 0, need);
  q->capacity = capacity;

  int rc = beast_robust_mutex_init(&q->mutex);
  if (rc != BEAST_OK)
    return rc;

  /* Magic last: a block is valid only once everything above is in place. */
  __atomic_store_n(&q->magic, BEAST_QUEUE_MAGIC, __ATOMIC_RELEASE);
  return BEAST_OK;
}

int beast_queue_put(void *mem, int32_t value) {
  struct beast_queue *q = checked(mem);
  if (q == NULL)
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
  __atomic_store_n(&q->seq, q->seq + 1, __ATOMIC_RELEASE);
  uint32_t waiters = q->nwaiters;
  unlock(q);
  /* One value, one wake. Skipping the syscall when nobody sleeps keeps the
   * common case (a non-empty free queue) free of kernel calls. */
  if (waiters > 0)
    beast_futex_wake(&q->seq, 1);
  return BEAST_OK;
}

static int deadline_passed(const struct timespec *deadline) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec > deadline->tv_sec ||
         (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

int beast_queue_get(void *mem, int32_t *out, int64_t timeout_ns) {
  struct beast_queue *q = checked(mem);
  if (q == NULL || out == NULL)
    return BEAST_EINVAL;
  struct timespec deadline;
  const struct timespec *until = NULL; /* NULL: wait forever */
  if (timeout_ns >= 0) {
    deadline = beast_deadline_after(timeout_ns);
    until = &deadline;
  }

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
    if (timeout_ns == 0 || (until != NULL && deadline_passed(until))) {
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
