/*
 * beast/native/batcher.h -- a process-shared request table for central
 * (batched) inference.
 *
 * Actors stop running their own model copy: each posts K inference requests
 * (one per environment) into a table in shared memory and sleeps until all K
 * are answered. Inference servers (threads of the learner process) wait
 * until requests are ready, collect a batch of their indices, run one forward
 * pass over the rows those indices name in shared tensors, write the outputs
 * back, and answer the batch, which wakes exactly the actors whose requests
 * were all served. This file only moves indices and sleeps/wakes; the
 * observation and output tensors are the caller's, indexed by slot.
 *
 * Table layout
 *   num_groups groups (one per actor) of group_size slots (one per env):
 *   slot s belongs to group s / group_size, so group g owns slots
 *   [g * group_size, (g + 1) * group_size). num_servers servers split the
 *   groups into contiguous ranges, server i serving groups
 *   [i * G / S, (i + 1) * G / S) (integer division): a batch's indices then
 *   lie close together, which keeps the caller's index_select local. Every
 *   slot is EMPTY (nothing asked), READY (posted, not yet collected) or TAKEN
 *   (collected, not yet answered).
 *
 * Protocol
 *   actor:  write inputs of slots [g*K, g*K + n); post(g, n);
 *           wait_answered(g) until OK; read outputs of those slots.
 *   server: collect(i) -> indices; read inputs at indices; forward;
 *           write outputs at indices; answer(indices).
 *   post publishes with release ordering and collect takes with acquire, so
 *   the server sees the inputs written before post; answer and wait_answered
 *   pair the same way for the outputs.
 *
 * Ownership
 *   The caller allocates and frees the memory; C only borrows it. Python
 *   allocates it as a shared-memory torch uint8 tensor of
 *   beast_batcher_nbytes(...) bytes, 8-byte aligned and zeroed, and keeps it
 *   alive for as long as it holds the pointer. It must sit in a MAP_SHARED
 *   mapping to be used across processes (share_memory_() provides one).
 *
 * Thread and process safety
 *   beast_batcher_init runs exactly once, before any other call, with no
 *   concurrent user. After that every call may run concurrently from any
 *   thread of any process, under two rules the caller keeps:
 *   - a group has one actor at a time: post, wait_answered and reset_group
 *     for a group are never concurrent with each other (reset_group is for
 *     an actor that has died);
 *   - one thread collects for a given server index, and answers each batch
 *     before it collects the next. Otherwise a batch answered after its
 *     group was reset and re-posted could answer the new requests with the
 *     old outputs (answer identifies a slot by index, not by batch).
 *   There is no lock: slot and group states are atomics, so a process dying
 *   in any call leaves no lock held. Only collect and wait_answered block,
 *   and they sleep on futex words in the block (FUTEX_WAIT on shared memory,
 *   woken by FUTEX_WAKE from any process): no busy spinning, no Python on
 *   the wake path. Both register as waiters so that post and answer skip the
 *   wake syscall when nobody sleeps.
 *
 * Failure
 *   - An actor dies holding requests: the server never waits on a particular
 *     actor, so it does not hang; it serves the dead actor's READY requests
 *     and answers them into the void. reset_group(g) drops the group's READY
 *     and TAKEN requests so they are not served, and bumps the group's
 *     generation: an answer to a slot taken before the reset is then ignored
 *     (counted in stale), never credited to the group's next actor.
 *   - The server dies or stops answering: wait_answered takes a timeout so
 *     the actor can check that the server's process is alive and exit.
 *   - close wakes every waiter in every process at once: collect, post and
 *     wait_answered then fail with BEAST_ECLOSED. answer and reset_group still
 *     work after close (a server finishing its last batch is not an error).
 */
#ifndef BEAST_BATCHER_H
#define BEAST_BATCHER_H

/* Status codes and the futex helpers are shared with the index queue. */
#include "index_queue.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cffi cdef begin: what build.py declares to Python, up to the end mark. */

/* Largest table accepted: slots, and slots per group. Far below the 30-bit
 * slot encoding and the 32-bit counts, and a scan of a server's range stays
 * in the tens of microseconds. */
#define BEAST_BATCHER_MAX_SLOTS (1u << 24)

/* Bytes needed for the table; 0 if the sizes are invalid (any of them 0,
 * num_servers > num_groups, or more than BEAST_BATCHER_MAX_SLOTS slots). */
size_t beast_batcher_nbytes(uint32_t num_groups, uint32_t group_size,
                            uint32_t num_servers);

/* Initialise an empty, open table in mem (nbytes long, 8-byte aligned). */
int beast_batcher_init(void *mem, size_t nbytes, uint32_t num_groups,
                       uint32_t group_size, uint32_t num_servers);

/* Sizes the table was initialised with (any pointer may be NULL). */
int beast_batcher_sizes(void *mem, uint32_t *num_groups, uint32_t *group_size,
                        uint32_t *num_servers);

/* Groups [*lo, *hi) served by server `server`. */
int beast_batcher_server_groups(void *mem, uint32_t server, uint32_t *lo,
                                uint32_t *hi);

/* Post requests for the first `count` slots of `group` (1 <= count <=
 * group_size) and wake the group's server if it sleeps. BEAST_EFULL if the
 * group still has unanswered requests, BEAST_ECLOSED once closed. */
int beast_batcher_post(void *mem, uint32_t group, uint32_t count);

/* Sleep until every request of `group` is answered. timeout_ns < 0 waits
 * forever, 0 only polls. BEAST_OK (also when nothing was posted),
 * BEAST_ETIMEDOUT, BEAST_ECLOSED, or BEAST_EINTR when a signal arrived: the
 * caller retries with the time left. */
int beast_batcher_wait_answered(void *mem, uint32_t group, int64_t timeout_ns);

/* Collect a batch for server `server` into out (room for max_batch indices),
 * sorted ascending; *n_out is the count. Waits up to timeout_ns (< 0:
 * forever, 0: poll) for a first READY request; then keeps collecting until
 * it has max_batch, or at least min_batch, or window_ns have passed since
 * the first was taken (window_ns 0: take what is ready now and return). A
 * server scans its groups round robin, from the group after the one where
 * its last full batch stopped, so no group is starved when more are ready
 * than max_batch. Returns BEAST_OK with
 * *n_out >= 1, BEAST_ETIMEDOUT with *n_out == 0, BEAST_ECLOSED (slots taken
 * in this call stay TAKEN: shutdown), or BEAST_EINTR with *n_out == 0 when a
 * signal arrived before anything was taken (a signal during the window ends
 * the window early instead). 1 <= min_batch <= max_batch. */
int beast_batcher_collect(void *mem, uint32_t server, int64_t *out,
                          uint32_t max_batch, uint32_t min_batch,
                          int64_t timeout_ns, int64_t window_ns,
                          uint32_t *n_out);

/* Answer n collected slots: each TAKEN slot becomes EMPTY and its group's
 * pending count drops; groups whose count reaches 0 are woken. Slots that are
 * not TAKEN (dropped by reset_group), or whose group was reset since they were
 * posted, are ignored and counted in stale. BEAST_EINVAL, with nothing
 * changed, if any index is out of range. */
int beast_batcher_answer(void *mem, const int64_t *indices, uint32_t n);

/* Drop every READY and TAKEN request of `group` (its actor died) and start a
 * new generation for it: the group is then EMPTY with nothing pending. */
int beast_batcher_reset_group(void *mem, uint32_t group);

/* Number of unanswered requests of `group`, into *out. */
int beast_batcher_pending(void *mem, uint32_t group, uint32_t *out);

/* Close the table and wake every waiter, servers and actors. Idempotent. */
int beast_batcher_close(void *mem);

/* Running totals, for diagnostics and tests. */
struct beast_batcher_stats {
  uint64_t posted;   /* requests posted */
  uint64_t answered; /* requests answered and credited to their group */
  uint64_t dropped;  /* READY or TAKEN requests dropped by reset_group */
  uint64_t stale;    /* answers ignored: slot not TAKEN or group reset */
};
int beast_batcher_stats(void *mem, struct beast_batcher_stats *out);

/* cffi cdef end */

#ifdef __cplusplus
}
#endif

#endif /* BEAST_BATCHER_H */
