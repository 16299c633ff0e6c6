/* bench/medium.c - benchmark of medium blocks (8 KB .. 1 MB) that are really used, one binary per allocator.
 *
 * What it measures: one thread keeps 2000 live blocks in an array, then makes 2 million random
 * replacements: pick a random slot, free its block, allocate a new block of a random size (uniform in
 * the row's range) into the slot and write to it: one byte per 4 KB page and the first and last
 * 64 bytes, so every page of the block is really used (and, on fresh memory, faulted in). Rows:
 *   64k-1m     sizes 65536..1048576   (about 1.1 GB live on average)
 *   16k-256k   sizes 16384..262144    (about 280 MB live)
 *   8k-16k     sizes 8192..16384      (about 24 MB live)
 * The cost of an allocator here is its own work plus the page faults it causes: one that gives memory
 * back to the OS at free and takes fresh memory at malloc pays a fault per touched page (about 17 us on
 * the VMs we use), one that reuses its memory pays cache misses only. Hence page faults are reported
 * beside time.
 *
 * How: the same source is compiled once per allocator, chosen by one ALLOC_* define (the macro block
 * below). Slots and sizes come from a fixed-seed splitmix64 generator, drawn inside the loop (a few ns,
 * against microseconds per step; a table of 2 million steps would itself add 12 MB of faults and RSS),
 * so every allocator sees the same sequence. The untimed fill allocates the 2000 blocks; the
 * replacement loop runs between two readings of clock_gettime(CLOCK_MONOTONIC). Then every block is
 * freed. Each block's first byte holds a tag that is checked just before its free; the first and last
 * bytes read back at free go into a checksum that must equal the sum of the bytes written there (so
 * the writes cannot be optimised away, and a block the allocator overlapped or clobbered shows up).
 * Any mismatch makes the exit code 1.
 *
 * Usage: medium-<alloc> row [-scale F]
 *   Runs one row (each row in its own process, so peak RSS and page faults are that row's alone);
 *   -scale multiplies the number of replacements (default 1 = 2 million). Prints one line on stdout,
 *   "row ms peak_rss_mb page_faults": ms of the replacement loop, peak RSS of the process in MB
 *   (getrusage ru_maxrss), minor + major page faults of the whole process (fill, loop and teardown).
 *   Errors go to stderr.
 */
#define _POSIX_C_SOURCE 200809L

#define BENCH_NAME "medium"
#include "allocator.h" /* the allocator under test (one ALLOC_* define) and now_ns() */
#include "options.h"   /* -name value options */

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* ---- Helpers ---- */


/* splitmix64: fixed seed per row, so every allocator gets the same slots and sizes. */
static uint64_t rng_state;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* ---- The probe ---- */

#define LIVE_BLOCKS 2000
#define REPLACEMENTS 2000000              /* at scale 1 */
#define PAGE 4096
#define EDGE 64                           /* bytes written at each end of a block */

struct row {
    const char *name;
    size_t lo, hi;                        /* sizes uniform in [lo, hi] */
    uint64_t seed;
};

static const struct row rows[] = {
    {"64k-1m", 65536, 1048576, 0x6d656469756d3031u},
    {"16k-256k", 16384, 262144, 0x6d656469756d3032u},
    {"8k-16k", 8192, 16384, 0x6d656469756d3033u},
};

static unsigned char *live_ptr[LIVE_BLOCKS];  /* globals: the blocks escape, nothing can be folded */
static uint32_t live_size[LIVE_BLOCKS];
static unsigned char live_tag[LIVE_BLOCKS];

static long check_failures;
static uint64_t sum_written, sum_read;          /* first + last byte of every block, written vs read back */

/* Writes the tag into the first and last EDGE bytes and one byte of every 4 KB page between. */
static inline void touch(unsigned char *p, size_t size, unsigned char tag)
{
    memset(p, tag, EDGE);
    for (size_t off = PAGE; off < size - EDGE; off += PAGE)
        p[off] = tag;
    memset(p + size - EDGE, tag, EDGE);
    sum_written += 2u * tag;
}

/* Checks the block in slot s and frees it. */
static inline void release(size_t s)
{
    unsigned char *p = live_ptr[s];
    unsigned char first = p[0];
    check_failures += first != live_tag[s];
    sum_read += first + p[live_size[s] - 1];
    bench_free(p);
}

/* Returns the ms of the replacement loop. */
static double run_row(const struct row *r, long replacements)
{
    size_t span = r->hi - r->lo + 1;
    rng_state = r->seed;
    for (size_t s = 0; s < LIVE_BLOCKS; s++) {  /* untimed fill */
        size_t size = r->lo + (size_t)(rng_next() % span);
        unsigned char tag = (unsigned char)(s * 7 + 1);
        live_ptr[s] = alloc_block(size);
        live_size[s] = (uint32_t)size;
        live_tag[s] = tag;
        touch(live_ptr[s], size, tag);
    }
    uint64_t t0 = now_ns();
    for (long i = 0; i < replacements; i++) {
        uint64_t x = rng_next();
        size_t s = (size_t)((x >> 32) % LIVE_BLOCKS);
        size_t size = r->lo + (size_t)((x & 0xffffffffu) % span);
        unsigned char tag = (unsigned char)(x >> 24);
        release(s);
        unsigned char *p = alloc_block(size);
        live_ptr[s] = p;
        live_size[s] = (uint32_t)size;
        live_tag[s] = tag;
        touch(p, size, tag);
    }
    uint64_t t1 = now_ns();
    for (size_t s = 0; s < LIVE_BLOCKS; s++)    /* untimed teardown */
        release(s);
    return (double)(t1 - t0) / 1e6;
}

static void usage(FILE *to)
{
    fprintf(to, "usage: medium row [-scale F]\nrows:");
    OPTION_LIST(to, rows);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    double scale = 1.0;
    int status = options_name_scale(argc, argv, &only, &scale, usage);
    if (status >= 0)
        return status;
    const struct row *row = OPTION_NEED(rows, only, "row", usage);

    long replacements = (long)((double)REPLACEMENTS * scale);
    if (replacements < 1)
        replacements = 1;
    double ms = run_row(row, replacements);

    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) {
        perror("medium: getrusage");
        return 1;
    }
    printf("%s %.1f %.1f %ld\n", row->name, ms, (double)ru.ru_maxrss / 1024.0,
           (long)(ru.ru_minflt + ru.ru_majflt));
    fflush(stdout);
    if (check_failures != 0 || sum_read != sum_written) {
        fprintf(stderr, "medium: %ld tag mismatches, checksum read %llu, written %llu\n", check_failures,
                (unsigned long long)sum_read, (unsigned long long)sum_written);
        return 1;
    }
    return 0;
}
