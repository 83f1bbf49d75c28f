/*
 * beast/native/sum_tree.h -- a process-shared sum tree for prioritized
 * replay (Schaul et al. 2016, "Prioritized Experience Replay", appendix B.2.1).
 *
 * `capacity` leaves hold non-negative priorities p_i; sampling a draw u in
 * [0, 1] returns the leaf i whose cumulative range [sum_{j<i} p_j,
 * sum_{j<=i} p_j) contains u * total, so index i comes out with probability
 * p_i / total. Updates and samples cost O(log capacity). A parallel max tree
 * gives the largest priority in O(1) (new replay entries enter with it).
 *
 * Precision
 *   Priorities and every internal sum are float64. With float32 sums a
 *   descent can walk into a subtree whose stored sum rounded above the sum
 *   of its leaves and land on a zero-priority leaf (rlpyt documents exactly
 *   this). Here every internal node is recomputed as the sum of its two
 *   children on every update (never adjusted by a delta), so rounding cannot
 *   drift over millions of updates; and the descent never enters a child
 *   whose sum is zero, so a zero-priority leaf is never returned while the
 *   total is positive.
 *
 * Generations (replay slots)
 *   Each leaf carries a 64-bit generation. beast_sumtree_claim hands out the
 *   next slot of the ring, sets its priority to 0 (so it cannot be sampled
 *   while its data is being written), bumps its generation and records the
 *   claiming process as the slot's writer; beast_sumtree_commit sets the
 *   priority and clears the writer once the data is written. A claim skips
 *   slots whose writer is still alive, so two writers never share a slot
 *   (one descheduled mid-write while another laps the ring would otherwise
 *   interleave two sequences under a live priority); a writer that died
 *   mid-write no longer holds its slot. Samples report each leaf's
 *   generation, and an update that passes generations only changes leaves
 *   whose generation still matches: a priority computed for data that has
 *   since been overwritten is dropped.
 *
 * Ownership
 *   The caller allocates and frees the memory; C only borrows it. Python
 *   allocates it as a shared-memory torch uint8 tensor of
 *   beast_sumtree_nbytes(capacity) bytes, 8-byte aligned and zeroed, and
 *   keeps it alive for as long as it holds the pointer. To be shared between
 *   processes it must sit in a MAP_SHARED mapping (share_memory_()).
 *
 * Thread and process safety
 *   beast_sumtree_init must run exactly once, before any other call, with no
 *   concurrent user. After that every call may run concurrently from any
 *   number of threads in any number of processes: each call holds one
 *   robust, process-shared mutex for its whole duration (a batch of n
 *   updates or samples is one critical section, so a sample sees either all
 *   or none of a concurrent batch update, and its total matches its
 *   priorities). No call blocks for longer than its own O(n log capacity)
 *   work plus waiting for the lock.
 *
 * Owner death
 *   A process killed inside a call leaves the leaf it was writing either
 *   old or new, but the sums above it may be half-propagated. The next
 *   locker rebuilds every internal node from the leaves (O(capacity)), so
 *   the total is again exactly the sum of the leaves; owner_deaths counts
 *   these recoveries.
 *
 * Checkpoints
 *   beast_sumtree_export copies the logical state (leaf priorities and
 *   generations, claim counter, ring cursor) and beast_sumtree_restore puts
 *   it back into a tree of the same capacity, rebuilding the sums; slot
 *   writers are not part of it, so every slot is free after a restore.
 *
 * Argument checks
 *   Indices must lie in [0, capacity), priorities must be finite and >= 0,
 *   draws finite and in [0, 1]. Every batch is checked before anything is
 *   written: a bad batch returns BEAST_EINVAL and changes nothing.
 */
#ifndef BEAST_SUM_TREE_H
#define BEAST_SUM_TREE_H

#include "index_queue.h" /* enum beast_status, robust mutex helpers */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cffi cdef begin: what build.py declares to Python, up to the end mark. */

/* Largest capacity accepted: 2^28 leaves is 8 GiB of tree, far beyond any
 * replay this engine holds, and keeps every size computation far from
 * overflow. */
#define BEAST_SUMTREE_MAX_CAPACITY (1u << 28)

struct beast_sumtree_stats {
  double total;          /* sum of all priorities */
  double max;            /* largest priority (0 when all are 0) */
  uint64_t claims;       /* beast_sumtree_claim calls so far */
  uint32_t owner_deaths; /* lock recoveries after a holder died */
};

/* Bytes needed for a tree of `capacity` leaves; 0 if capacity is invalid. */
size_t beast_sumtree_nbytes(uint32_t capacity);

/* Initialise a tree of zero priorities and generations in `mem`. */
int beast_sumtree_init(void *mem, size_t nbytes, uint32_t capacity);

/* Capacity the tree was initialised with, into *out. */
int beast_sumtree_capacity(void *mem, uint32_t *out);

/* Set priorities[k] at leaf indices[k], k < n, in order (a repeated index
 * keeps its last value). With `generations` non-NULL, only where the leaf's
 * generation equals generations[k]. *applied (may be NULL) receives how many
 * leaves were written. */
int beast_sumtree_update(void *mem, const int64_t *indices,
                         const double *priorities, const uint64_t *generations,
                         uint32_t n, uint32_t *applied);

/* Priorities and generations of leaves indices[k]; either output may be
 * NULL. */
int beast_sumtree_get(void *mem, const int64_t *indices, uint32_t n,
                      double *priorities, uint64_t *generations);

/* For each draw u = draws[k] in [0, 1], the leaf whose cumulative range
 * holds u * total: its index, generation and priority. *total (may be NULL)
 * receives the total the draws were scaled by. BEAST_EEMPTY when every
 * priority is zero. */
int beast_sumtree_sample(void *mem, const double *draws, uint32_t n,
                         int64_t *indices, uint64_t *generations,
                         double *priorities, double *total);

/* Claim the next ring slot no live process is writing: its priority becomes
 * 0, its generation is bumped into *generation and the caller's process
 * becomes its writer. BEAST_EFULL when live writers hold every slot. */
int beast_sumtree_claim(void *mem, int64_t *index, uint64_t *generation);

/* Finish a claim: if the slot's generation is still `generation`, set its
 * priority (finite, >= 0) and release it; *applied (may be NULL) is 1 then,
 * else 0. */
int beast_sumtree_commit(void *mem, int64_t index, uint64_t generation,
                         double priority, uint32_t *applied);

/* Make leaves indices[k], k < n, unsampleable while their data is rewritten
 * in place (a per-env ring of steps, whose slots are not claimed in ring
 * order): priority 0 and the generation bumped, into generations[k] (may be
 * NULL), so samples and priority updates made before are recognised as
 * stale. The writer then sets the new priority with beast_sumtree_update. */
int beast_sumtree_invalidate(void *mem, const int64_t *indices, uint32_t n,
                             uint64_t *generations);

/* Total, max, claims and owner deaths, read under the lock. */
int beast_sumtree_stats(void *mem, struct beast_sumtree_stats *out);

/* Copy the tree's logical state, in one critical section, for a checkpoint:
 * every leaf's priority and generation into priorities[i] and
 * generations[i], i < capacity, and the claim counter and ring cursor into
 * *claims and *cursor. Internal nodes are not copied (they are a function of
 * the leaves), nor are slot writers (pids mean nothing in another run) or
 * owner_deaths. `capacity` must equal the tree's (it is the length of both
 * arrays); every pointer must be non-NULL. O(capacity) under the lock. */
int beast_sumtree_export(void *mem, double *priorities, uint64_t *generations,
                         uint32_t capacity, uint64_t *claims,
                         uint64_t *cursor);

/* Replace the tree's logical state with one beast_sumtree_export produced
 * (from this tree or another of the same capacity), in one critical section:
 * set every leaf's priority and generation, the claim counter and the ring
 * cursor, clear every slot's writer, and rebuild every internal node of the
 * sum and max trees from the leaves (as owner-death recovery does), so the
 * tree then samples, claims and updates exactly as the exported one would
 * have. owner_deaths is kept. BEAST_EINVAL, changing nothing, unless
 * `capacity` equals the tree's and every priority is finite and >= 0.
 *
 * Meant for resuming from a checkpoint, before any writer claims a slot: a
 * claim made before the restore loses its slot (the slot is free again), and
 * its commit applies only if the restored generation happens to match.
 * Concurrent samples see either the old tree or the restored one, never a
 * mix. O(capacity) under the lock. */
int beast_sumtree_restore(void *mem, const double *priorities,
                          const uint64_t *generations, uint32_t capacity,
                          uint64_t claims, uint64_t cursor);

/* cffi cdef end */

#ifdef __cplusplus
}
#endif

#endif /* BEAST_SUM_TREE_H */
