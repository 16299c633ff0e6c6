/* bench/instr.c - the workload of the instruction-count benchmark (bench/instr.py), one binary per
 * allocator: small allocations on the owner thread, counted under valgrind --tool=callgrind.
 *
 * Each row calls the allocator only from functions named measure_<what> (noinline), so that the
 * runner can read from callgrind's call graph exactly the instructions spent inside the allocator's
 * functions (the calls out of measure_*), and how many calls there were:
 *   burst-16, burst-64     allocate 4000 blocks in a row (measure_malloc), then free them in a row
 *                          (measure_free); 51 rounds, the first carving the page. Later rounds find a long
 *                          free list, so nearly every call takes the fast path: the per-call count is the
 *                          fast path's plus a small share of the slow path (the page empties each round).
 *   pair-32, pair-4000     malloc and free at once (measure_pair), 100 blocks of the size kept live so the
 *                          page never empties: the slow path's share as a malloc/free loop sees it.
 *   alone-32               malloc and free at once with nothing else live (micro's fixed-32): the page
 *                          empties at every free, and stays, as the only page of its class.
 *   realloc-in-class       one block of 100 bytes resized to 110 and back (measure_realloc): within its
 *                          class, so no allocator needs to move it.
 * Every block gets a byte written and read back (a mismatch exits 1), as a caller would.
 *
 * Usage: instr-<alloc> <row>; prints "row calls" and nothing else; errors go to stderr.
 */
#define _POSIX_C_SOURCE 200809L

#define BENCH_NAME "instr"
#include "allocator.h"

#include <string.h>

#define BURST 4000
#define ROUNDS 50
#define PAIRS 100000
#define LIVE 100

static void *blocks[BURST];
static unsigned long mismatches;

__attribute__((noinline)) static void measure_malloc(size_t size, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        unsigned char *p = alloc_block(size);
        p[0] = (unsigned char)i;
        blocks[i] = p;
    }
}

__attribute__((noinline)) static void measure_free(unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        unsigned char *p = blocks[i];
        mismatches += p[0] != (unsigned char)i;
        bench_free(p);
    }
}

__attribute__((noinline)) static void measure_pair(size_t size, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        unsigned char *p = alloc_block(size);
        p[0] = (unsigned char)i;
        mismatches += p[0] != (unsigned char)i;
        bench_free(p);
    }
}

__attribute__((noinline)) static void *measure_realloc(unsigned char *p, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        p = bench_realloc(p, i & 1 ? 100 : 110);
        if (p == NULL)
            out_of_memory(110);
        mismatches += p[0] != 0x5a;
    }
    return p;
}

static unsigned long burst(size_t size)
{
    for (unsigned round = 0; round <= ROUNDS; round++) { /* round 0 is the untimed one: the same calls */
        measure_malloc(size, BURST);
        measure_free(BURST);
    }
    return (unsigned long)(ROUNDS + 1) * BURST;
}

static unsigned long pair(size_t size)
{
    for (unsigned i = 0; i < LIVE; i++)
        blocks[i] = alloc_block(size);
    measure_pair(size, PAIRS);
    for (unsigned i = 0; i < LIVE; i++)
        bench_free(blocks[i]);
    return PAIRS;
}

static unsigned long alone(size_t size)
{
    measure_pair(size, PAIRS);
    return PAIRS;
}

static unsigned long realloc_in_class(void)
{
    unsigned char *p = alloc_block(100);
    memset(p, 0x5a, 100);
    p = measure_realloc(p, PAIRS);
    bench_free(p);
    return PAIRS;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s burst-16|burst-64|pair-32|pair-4000|alone-32|realloc-in-class\n", argv[0]);
        return 2;
    }
    const char *row = argv[1];
    unsigned long calls;
    if (strcmp(row, "burst-16") == 0)
        calls = burst(16);
    else if (strcmp(row, "burst-64") == 0)
        calls = burst(64);
    else if (strcmp(row, "pair-32") == 0)
        calls = pair(32);
    else if (strcmp(row, "pair-4000") == 0)
        calls = pair(4000);
    else if (strcmp(row, "alone-32") == 0)
        calls = alone(32);
    else if (strcmp(row, "realloc-in-class") == 0)
        calls = realloc_in_class();
    else {
        fprintf(stderr, "instr: unknown row %s\n", row);
        return 2;
    }
    if (mismatches != 0) {
        fprintf(stderr, "instr: %lu blocks lost their contents\n", mismatches);
        return 1;
    }
    printf("%s %lu\n", row, calls);
    return 0;
}
