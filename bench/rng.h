/* rng.h - the random numbers of the benchmark programs (churn.c, shapes.c, large.c): fixed seeds, so
 * that every allocator gets the same sizes and slots. mix64 spreads a seed (a round or scenario and a
 * thread) into a generator's state, rng_next is that generator. */
#ifndef BENCH_RNG_H
#define BENCH_RNG_H

#include <stdint.h>

/* splitmix64 step. */
static inline uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* xorshift64*: one state per thread (never 0). */
static inline uint64_t rng_next(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545f4914f6cdd1du;
}

#endif
