/*
 * beast/native/index_queue.h -- a process-shared FIFO of int32 slot indices.
 *
 * Actors and the learner exchange rollout-slot indices through a "free" and a
 * "full" queue (TorchBeast's protocol). This queue lives entirely inside one
 * caller-provided block of memory, so any process that maps the block can use
 * it. Waiting is a futex sleep on a word inside the block: no spinning, no
 * Python on the wake path.
 *
 * Ownership
 *   The caller allocates and frees the memory; C only borrows it. Python
 *   allocates it as a shared-memory torch uint8 tensor and keeps that tensor
 *   alive for as long as it holds the pointer. The block must be at least
 *   beast_queue_nbytes(capacity) bytes, aligned to 8 bytes, and zeroed or
 *   otherwise never initialised before beast_queue_init. To share the queue
 *   between processes the block must sit in a MAP_SHARED mapping (torch's
 *   share_memory_() or a fork of the initialising process provides one); in
 *   a private mapping it still works, but only between threads.
 *
 * Thread and process safety
 *   beast_queue_init must run exactly once, before any other call, with no
 *   concurrent user of the block. After that, put, get, close, size and
 *   owner_deaths may be called concurrently from any number of threads in any
 *   number of processes. Every call is short and non-blocking except
 *   beast_queue_get, which sleeps until a value arrives, the queue closes,
 *   its timeout expires or a signal interrupts it. No call may race with the
 *   memory being unmapped or freed.
 *
 * Owner death
 *   The internal lock is a robust, process-shared pthread mutex. If a process
 *   dies while holding it, the next locker recovers it and carries on. Ring
 *   writes are ordered (value written, then the index published) so that a
 *   death mid-operation loses at most the one value being put or got (none
 *   with owner marks, below), and never corrupts the ring. A process that dies while sleeping in
 *   beast_queue_get holds no lock and costs nothing. One gap: a waiter killed
 *   after a put woke it but before it took the value leaves that value queued
 *   while other waiters sleep on; the next put or close wakes them again.
 *
 * Closing
 *   beast_queue_close wakes every waiter in every process at once. After it,
 *   put and get fail with BEAST_ECLOSED (values still queued are abandoned);
 *   size and snapshot still report them. Close is idempotent.
 *
 * Owner marks (rollout slots, beast/buffers.py)
 *   Values are slot indices, and a caller-provided int64 array `marks` (one
 *   entry per slot, in shared memory like the queue) records who holds each
 *   slot that is in no queue: BEAST_NO_OWNER (-1) or an owner id >= 0.
 *   get_marked and put_marked move a value AND set its mark inside one
 *   critical section, in this order: a get sets the mark before it pops, a
 *   put pushes before it sets the mark. A process killed anywhere in them
 *   therefore leaves its value queued, or marked with its own id, or both
 *   (never neither): the slot is never lost. beast_queue_reclaim resolves
 *   "both": holding the locks of the two queues a slot can be on, it returns
 *   the slot of a dead owner to the free queue only if it is on neither, so
 *   it is never doubled either. Two rules make that exact: every get that
 *   takes a slot out of a queue marks it (its new holder, or
 *   BEAST_NO_OWNER for a holder that never dies alone, such as the learner),
 *   and reclaim runs only once the owner is dead.
 */
#ifndef BEAST_INDEX_QUEUE_H
#define BEAST_INDEX_QUEUE_H

#ifndef __linux__
#error "beast's native queue needs Linux futexes"
#endif

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cffi cdef begin: what build.py declares to Python, up to the end mark. */

/* Return codes. Every int-returning call returns one of these. */
enum beast_status {
  BEAST_OK = 0,
  BEAST_ETIMEDOUT = 1, /* get: no value before the timeout */
  BEAST_ECLOSED = 2,   /* put/get: the queue has been closed */
  BEAST_EFULL = 3,     /* put: capacity values already queued */
  BEAST_EINVAL = 4,    /* bad pointer, size, alignment or capacity */
  BEAST_EINTR = 5,     /* get: a signal arrived; retry with the time left */
  BEAST_ENOTRECOVERABLE = 6, /* the lock is permanently unusable */
  BEAST_ESYS = 7,            /* an unexpected pthread or futex failure */
  BEAST_EEMPTY = 8,          /* sum tree sample: every priority is zero */
};

/* The owner mark of a slot that nobody (or only a queue) holds. */
#define BEAST_NO_OWNER (-1)

/* Largest capacity accepted; keeps the byte size far from overflow. */
#define BEAST_QUEUE_MAX_CAPACITY (1u << 28)

/* Bytes needed for a queue of `capacity` values; 0 if capacity is invalid
 * (0 or above BEAST_QUEUE_MAX_CAPACITY). */
size_t beast_queue_nbytes(uint32_t capacity);

/* Initialise an empty, open queue in `mem` (nbytes long, 8-byte aligned). */
int beast_queue_init(void *mem, size_t nbytes, uint32_t capacity);

/* Append `value`. Never blocks: BEAST_EFULL when full, BEAST_ECLOSED when
 * closed. */
int beast_queue_put(void *mem, int32_t value);

/* Pop the oldest value into *out. timeout_ns < 0 waits forever, 0 only
 * polls. Returns BEAST_ETIMEDOUT, BEAST_ECLOSED, or BEAST_EINTR when a signal
 * handler ran during the wait: the caller retries with the time left (this
 * lets Python raise KeyboardInterrupt from a blocked get). */
int beast_queue_get(void *mem, int32_t *out, int64_t timeout_ns);

/* As beast_queue_get, and marks[*out] = mark before the value leaves the
 * queue, in the same critical section (Owner marks above). marks has n_marks
 * entries; a queued value outside [0, n_marks) is BEAST_EINVAL and stays
 * queued. */
int beast_queue_get_marked(void *mem, int32_t *out, int64_t timeout_ns,
                           int64_t *marks, uint32_t n_marks, int64_t mark);

/* As beast_queue_put, and marks[value] = mark once the value is queued, in
 * the same critical section. */
int beast_queue_put_marked(void *mem, int32_t value, int64_t *marks,
                           uint32_t n_marks, int64_t mark);

/* Return slot `value` of dead owner `owner` (Owner marks above): if
 * marks[value] == owner, clear the mark and, unless the value is queued on
 * free_mem or full_mem, put it on free_mem. *returned is 1 when it was put
 * back, else 0. Holds both queues' locks (full first), so no other call may
 * hold two queue locks at once. BEAST_ECLOSED (nothing changed) when free_mem
 * is closed. */
int beast_queue_reclaim(void *free_mem, void *full_mem, int64_t *marks,
                        uint32_t n_marks, int32_t value, int64_t owner,
                        int32_t *returned);

/* Copy the queued values, oldest first, into out (room for `room`); *n_out
 * is how many are queued (only the first `room` are copied). */
int beast_queue_snapshot(void *mem, int32_t *out, uint32_t room,
                         uint32_t *n_out);

/* Close the queue and wake every waiter. Idempotent. */
int beast_queue_close(void *mem);

/* Number of values queued, into *out. */
int beast_queue_size(void *mem, uint32_t *out);

/* Capacity the queue was initialised with, into *out. */
int beast_queue_capacity(void *mem, uint32_t *out);

/* How many times a process died holding the lock and the lock was recovered,
 * into *out. For diagnostics: a non-zero value means an actor died mid-call. */
int beast_queue_owner_deaths(void *mem, uint32_t *out);

/* cffi cdef end */

/*
 * Futex helpers, shared with other native components (e.g. a batched
 * inference server). They use shared futexes (no FUTEX_PRIVATE_FLAG), so the
 * word may live in memory mapped by several processes.
 */

/* Sleep while *word == expected. deadline is an absolute CLOCK_MONOTONIC time,
 * or NULL to wait forever. Returns 0 when woken (possibly spuriously), EAGAIN
 * if *word != expected on entry, ETIMEDOUT, EINTR, or another errno. */
static inline int beast_futex_wait(uint32_t *word, uint32_t expected,
                                   const struct timespec *deadline) {
  /* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline, so a retry
   * after EINTR or a spurious wake needs no remaining-time arithmetic. */
  long rc = syscall(SYS_futex, word, FUTEX_WAIT_BITSET, expected, deadline,
                    NULL, FUTEX_BITSET_MATCH_ANY);
  return rc == 0 ? 0 : errno;
}

/* Wake up to n sleepers on word (INT_MAX: all); returns the count or -1. */
static inline int beast_futex_wake(uint32_t *word, int n) {
  return (int)syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
}

/* Absolute CLOCK_MONOTONIC deadline timeout_ns from now (timeout_ns >= 0). */
static inline struct timespec beast_deadline_after(int64_t timeout_ns) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  /* Clamp so that tv_sec cannot overflow: ~292 years is "forever" enough. */
  const int64_t max_ns = INT64_MAX / 2;
  if (timeout_ns > max_ns)
    timeout_ns = max_ns;
  int64_t ns = (int64_t)now.tv_nsec + timeout_ns % 1000000000;
  struct timespec deadline;
  deadline.tv_sec = now.tv_sec + (time_t)(timeout_ns / 1000000000) +
                    (time_t)(ns / 1000000000);
  deadline.tv_nsec = (long)(ns % 1000000000);
  return deadline;
}

/* Whether the absolute CLOCK_MONOTONIC time *deadline has passed. */
static inline int beast_deadline_passed(const struct timespec *deadline) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec > deadline->tv_sec ||
         (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

/* The deadline of a wait of timeout_ns from now, set in *deadline and
 * returned; NULL (no deadline, what beast_futex_wait takes to wait forever)
 * when timeout_ns < 0. */
static inline const struct timespec *
beast_wait_deadline(int64_t timeout_ns, struct timespec *deadline) {
  if (timeout_ns < 0)
    return NULL;
  *deadline = beast_deadline_after(timeout_ns);
  return deadline;
}

/* Whether a wait of timeout_ns with deadline `until` (beast_wait_deadline)
 * is over: a timeout of 0 only polls, so it is over at the first look. */
static inline int beast_wait_over(int64_t timeout_ns,
                                  const struct timespec *until) {
  return timeout_ns == 0 || (until != NULL && beast_deadline_passed(until));
}

/*
 * Shared-block helpers, shared with other native components. Every
 * component's block starts with a 64-bit magic word of its own, which its
 * init writes last (release) and every call reads first (acquire): a block is
 * valid only once everything else in it is in place.
 */

/* Start initialising a block of `need` bytes (0: invalid sizes) in mem,
 * nbytes long: zero it and return BEAST_OK, or return BEAST_EINVAL (changing
 * nothing) for a null, short or misaligned (to `align`) mem, or for a block
 * that already holds `magic`: re-initialising a live block would strand its
 * users. */
static inline int beast_block_init(void *mem, size_t nbytes, size_t need,
                                   size_t align, uint64_t magic) {
  if (mem == NULL || need == 0 || nbytes < need ||
      (uintptr_t)mem % align != 0)
    return BEAST_EINVAL;
  if (__atomic_load_n((uint64_t *)mem, __ATOMIC_ACQUIRE) == magic)
    return BEAST_EINVAL;
  memset(mem, 0, need);
  return BEAST_OK;
}

/* Finish initialising the block: its magic, last. */
static inline void beast_block_publish(void *mem, uint64_t magic) {
  __atomic_store_n((uint64_t *)mem, magic, __ATOMIC_RELEASE);
}

/* Whether mem is an initialised block holding `magic`. Cannot catch every bad
 * pointer (an unmapped one still faults), only null, misaligned (to `align`),
 * never-initialised or overwritten blocks. */
static inline int beast_block_valid(void *mem, size_t align, uint64_t magic) {
  return mem != NULL && (uintptr_t)mem % align == 0 &&
         __atomic_load_n((uint64_t *)mem, __ATOMIC_ACQUIRE) == magic;
}

/*
 * Robust, process-shared mutex helpers, shared with other native components
 * (the sum tree). The mutex must live in the shared block itself.
 */

/* Initialise *mutex as PTHREAD_PROCESS_SHARED and PTHREAD_MUTEX_ROBUST.
 * Returns BEAST_OK or BEAST_ESYS. */
static inline int beast_robust_mutex_init(pthread_mutex_t *mutex) {
  pthread_mutexattr_t attr;
  if (pthread_mutexattr_init(&attr) != 0)
    return BEAST_ESYS;
  int rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  if (rc == 0)
    rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  if (rc == 0)
    rc = pthread_mutex_init(mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  return rc == 0 ? BEAST_OK : BEAST_ESYS;
}

/* Lock *mutex. When the previous holder died holding it, the lock is taken,
 * marked consistent and *recovered set to 1 (0 otherwise): the caller then
 * repairs whatever the dead holder may have left half-done, still holding
 * the lock. Returns BEAST_OK, BEAST_ENOTRECOVERABLE or BEAST_ESYS (and then
 * does not hold the lock). */
static inline int beast_robust_mutex_lock(pthread_mutex_t *mutex,
                                          int *recovered) {
  *recovered = 0;
  int rc = pthread_mutex_lock(mutex);
  if (rc == 0)
    return BEAST_OK;
  if (rc == EOWNERDEAD) {
    if (pthread_mutex_consistent(mutex) != 0) {
      pthread_mutex_unlock(mutex);
      return BEAST_ESYS;
    }
    *recovered = 1;
    return BEAST_OK;
  }
  if (rc == ENOTRECOVERABLE)
    return BEAST_ENOTRECOVERABLE;
  return BEAST_ESYS;
}

#ifdef __cplusplus
}
#endif

#endif /* BEAST_INDEX_QUEUE_H */
