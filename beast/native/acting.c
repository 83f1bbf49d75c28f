/* beast/native/acting.c -- see acting.h. */
#include "acting.h"

#include <math.h>
#include <string.h>

#include "index_queue.h" /* enum beast_status */

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void beast_rng_seed(struct beast_rng *rng, uint64_t seed) {
  /* splitmix64 expansion, as xoshiro's authors recommend: never all zero. */
  for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t next_u64(struct beast_rng *rng) {
  uint64_t *s = rng->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double beast_rng_uniform(struct beast_rng *rng) {
  return (double)(next_u64(rng) >> 11) * 0x1.0p-53;
}

static int64_t sample_row(struct beast_rng *rng, const float *row, uint32_t n) {
  double top = -INFINITY;
  for (uint32_t a = 0; a < n; a++) {
    double x = row[a];
    if (isnan(x) || x == INFINITY) return a;
    if (x > top) top = x;
  }
  if (top == -INFINITY) return 0;
  double total = 0.0;
  for (uint32_t a = 0; a < n; a++) total += exp((double)row[a] - top);
  /* total >= 1 (the largest term is exp(0)); u < total. */
  double u = beast_rng_uniform(rng) * total;
  double cumulative = 0.0;
  int64_t last_possible = 0;
  for (uint32_t a = 0; a < n; a++) {
    double weight = exp((double)row[a] - top);
    if (weight > 0.0) {
      cumulative += weight;
      last_possible = a;
      if (u < cumulative) return a;
    }
  }
  /* Rounding put u at or past the recomputed sum: the last action that can occur. */
  return last_possible;
}

int beast_sample_softmax(struct beast_rng *rng, const float *logits, uint32_t rows,
                         uint32_t num_actions, int64_t *actions) {
  if (num_actions == 0) return BEAST_EINVAL;
  for (uint32_t i = 0; i < rows; i++)
    actions[i] = sample_row(rng, logits + (uint64_t)i * num_actions, num_actions);
  return BEAST_OK;
}

int beast_copy_run(const struct beast_copy *copies, uint32_t n, uint32_t step,
                   uint32_t max_step) {
  if (step > max_step) return BEAST_EINVAL;
  for (uint32_t i = 0; i < n; i++) {
    const struct beast_copy *c = &copies[i];
    memcpy((char *)c->dst + (uint64_t)step * c->dst_step, c->src, c->nbytes);
  }
  return BEAST_OK;
}
