/*
 * beast/native/acting.h -- an actor's per-step work outside the env and the
 * model, one native call each: sampling actions from softmax(logits), and
 * copying a step's fields into rollout slots.
 *
 * Why C: an actor steps K envs for milliseconds between two policy steps,
 * which evicts the interpreter's and torch's code from the caches; every
 * Python or torch call made after the env step then runs cold (a 4-op torch
 * sampler costs ~60 us per K=8 step there, against ~15 us hot). One call into
 * a few hundred bytes of C does the same work in a few microseconds.
 *
 * Thread safety: none inside. A `beast_rng` belongs to one thread; a copy
 * list is read-only during `beast_copy_run` and may be shared.
 */
#ifndef BEAST_ACTING_H
#define BEAST_ACTING_H

#include <stdint.h>

/* cffi cdef begin: what build.py declares to Python, up to the end mark. */

/* xoshiro256** state; seed with beast_rng_seed, never all zero. */
struct beast_rng {
  uint64_t s[4];
};

void beast_rng_seed(struct beast_rng *rng, uint64_t seed);

/* A uniform double in [0, 1) with 53 random bits. */
double beast_rng_uniform(struct beast_rng *rng);

/*
 * actions[i] = a draw from softmax(logits[i, :]) for i < rows, by inverse
 * CDF on exp(logits - max) in double precision (one uniform per row).
 * Logits of -inf have probability 0. A row holding NaN or +inf has no
 * distribution: its action is the first such entry (what argmax-based
 * samplers give); a row of only -inf gets action 0. Returns BEAST_OK, or
 * BEAST_EINVAL when num_actions is 0.
 */
int beast_sample_softmax(struct beast_rng *rng, const float *logits, uint32_t rows,
                       uint32_t num_actions, int64_t *actions);

/*
 * One copy of a list: nbytes from src to dst + step * dst_step. A rollout
 * slot's field is [T+1, ...]; with dst its slot's row 0 and dst_step one
 * row's bytes, step t writes row t.
 */
struct beast_copy {
  void *dst;
  const void *src;
  uint64_t nbytes;
  uint64_t dst_step;
};

/*
 * Run copies[0..n) in order at `step`. Returns BEAST_EINVAL (copying
 * nothing) when step > max_step, the last step every dst has room for.
 */
int beast_copy_run(const struct beast_copy *copies, uint32_t n, uint32_t step,
                 uint32_t max_step);

/* cffi cdef end */

#endif /* BEAST_ACTING_H */
