/* test_aligned.c - deterministic tests of aligned allocation (shard_malloc_aligned, shard_realloc_aligned)
 * and of the rest of the malloc family under the shard_ prefix (shard_posix_memalign, shard_memalign,
 * shard_aligned_alloc, shard_valloc, shard_pvalloc, shard_reallocarray).
 *
 * The rules, as this file reads them (include/shardmm.h):
 * - align is a power of two from 1 to 2 MB; any other (0 too) gives NULL. A block lies at a multiple of
 *   align (of 16 at least: every block does), holds at least size bytes, and all of its usable size is
 *   the caller's.
 * - Its kind: size <= 16 KB with align <= 16 KB is a small block, of the smallest class that holds size
 *   bytes and is a multiple of align; else up to 1 MB a medium block; above that a large one.
 * - shard_free, shard_realloc and shard_usable_size take an aligned block like any other. A pointer
 *   into one that is not its start reaches the error hook and changes nothing; so does a second free.
 * - shard_realloc_aligned keeps the alignment and the contents (up to the smaller of the old usable size
 *   and the new size), stays in place when it can (a small block within its class and not below a
 *   quarter of it; a medium or large block that shrinks, or grows into free room after it), allocates
 *   for NULL, frees for size 0, and returns NULL with the block untouched for an impossible alignment.
 * - glibc's names: posix_memalign gives 22 (EINVAL) unless align is a power of two, a multiple of
 *   sizeof(void *) and at most 2 MB, 12 (ENOMEM) for an impossible size, and writes *out only on success;
 *   memalign and aligned_alloc take an align below 16 as 16 and round any other up to a power of two;
 *   valloc is page-aligned; pvalloc rounds the size up to whole pages (0 to one page); reallocarray is
 *   NULL when count * size overflows and leaves the block as it was. Failures report out of memory the
 *   C library's way: errno ENOMEM on Linux, the thread's last error ERROR_NOT_ENOUGH_MEMORY on Windows.
 *
 * Every block is filled with the pattern of its own seed over its whole usable size and checked before
 * it is freed, so overlapping blocks, a byte lost on a move and a stray write show up as a mismatch.
 * Each test ends with the live counts of shard_get_stats where they started and shard_check() == 0.
 *
 * Build: see build.ninja (build/test-aligned, build/debug/test-aligned, build/win64/test-aligned.exe and
 * its debug twin). Run: build/test-aligned [test names]
 */
#define HARNESS_MAIN
#include "harness.h"
#define PLATFORM_AFTER_EXIT
#include "platform.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shardmm.h"
#define SHARD_RULES 1 /* observe.h: this program checks shardmm's own rules, always */
#include "observe.h"

/* ---- the rules, written out independently of the allocator ---- */

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define SMALL_MAX (16 * KB)
#define MEDIUM_MAX MB
#define ALIGN_MAX (2 * MB)
#define ALIGN_COUNT 22 /* 1, 2, 4 .. 2 MB */
#define PAGE_BYTES (4 * KB)
#define EINVAL_CODE 22
#define ENOMEM_CODE 12

/* The small size classes (gen/sizeclasses.py). */
static const size_t test_classes[] = {
    16, 32, 64, 80, 96, 112, 128,
    160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048,
    2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096, 4608, 5120, 5632, 6144, 6656, 7168, 7680, 8192,
    10240, 12288, 14336, 16384,
};
#define CLASS_COUNT (sizeof test_classes / sizeof test_classes[0])

enum kind { KIND_SMALL, KIND_MEDIUM, KIND_LARGE, KIND_COUNT };
static const char *const kind_names[KIND_COUNT] = { "small", "medium", "large" };

static enum kind expected_kind(size_t size, size_t align)
{
    if (align > ALIGN_MAX) /* 4 MB and more: a large block that starts a 4 MB granule */
        return KIND_LARGE;
    if (size <= SMALL_MAX && align <= SMALL_MAX)
        return KIND_SMALL;
    return size <= MEDIUM_MAX ? KIND_MEDIUM : KIND_LARGE;
}

/* The usable size of a small aligned block: the smallest class that holds size bytes and is a multiple
 * of align (every class is a multiple of 16, and size 0 takes the first fitting class). */
static size_t expected_class(size_t size, size_t align)
{
    for (size_t i = 0; i < CLASS_COUNT; i++)
        if (test_classes[i] >= size && test_classes[i] % align == 0)
            return test_classes[i];
    return 0;
}

/* The alignment every block of an align request has: align, and 16 at least. */
static size_t effective_align(size_t align)
{
    return align < 16 ? 16 : align;
}

static int is_aligned(const void *p, size_t align)
{
    return ((uintptr_t)p & (align - 1)) == 0;
}

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* ---- observation helpers ---- */

typedef struct {
    size_t n[KIND_COUNT];
} live_counts;

static live_counts live_now(void)
{
    shard_stats s = stats_now();
    live_counts c = { { s.live_small, s.live_medium, s.live_large } };
    return c;
}

/* The kind whose live count grew by one since `before`, the others unchanged; -1 for anything else. */
static int grown_kind(live_counts before)
{
    live_counts now = live_now();
    int grown = -1;
    for (int k = 0; k < KIND_COUNT; k++) {
        if (now.n[k] == before.n[k] + 1 && grown == -1)
            grown = k;
        else if (now.n[k] != before.n[k])
            return -1;
    }
    return grown;
}

static void check_live_back(live_counts start, const char *where)
{
    live_counts now = live_now();
    CHECKF(memcmp(&now, &start, sizeof now) == 0,
           "%s: live small/medium/large %zu/%zu/%zu, at the start %zu/%zu/%zu", where, now.n[0], now.n[1],
           now.n[2], start.n[0], start.n[1], start.n[2]);
}

/* The end of every test: blocks other threads freed taken in (shard_collect), nothing left live that the
 * test made, and the heap consistent. */
static void check_end(live_counts start, const char *where)
{
    shard_collect();
    check_live_back(start, where);
    check_allocator(where);
}

/* Out of memory as the C library's callers learn it. */
static void oom_clear(void)
{
#ifdef _WIN32
    SetLastError(0);
#else
    errno = 0;
#endif
}

static int oom_reported(void)
{
#ifdef _WIN32
    return GetLastError() == ERROR_NOT_ENOUGH_MEMORY;
#else
    return errno == ENOMEM;
#endif
}

/* Checks the n bytes at p against the pattern of seed, naming the first wrong byte (the fast test first:
 * blocks are up to 10 MB). */
static void check_contents(const void *p, size_t n, uint64_t seed, const char *what)
{
    if (!holds_pattern((const unsigned char *)p, n, seed))
        CHECK_PATTERN(p, n, seed, what);
}

static void fill_block(void *p, size_t n, uint64_t seed)
{
    fill_range((unsigned char *)p, 0, n, seed);
}

/* Checks a block just returned for a request of size bytes at align, made when the live counts were
 * `before`: not NULL, aligned, of the expected kind (the live count of that kind grew by one), usable
 * for size bytes, exactly the expected class when small. Returns its usable size (0 for NULL). */
static size_t check_new_block(const void *p, size_t size, size_t align, live_counts before, const char *what)
{
    CHECKF(p != NULL, "%s: NULL", what);
    if (p == NULL)
        return 0;
    size_t usable = shard_usable_size(p);
    enum kind k = expected_kind(size, align);
    int grown = grown_kind(before);
    CHECKF(is_aligned(p, effective_align(align)), "%s = %p: not a multiple of %zu", what, p, effective_align(align));
    CHECKF(usable >= size, "%s: usable size %zu", what, usable);
    CHECKF(grown == (int)k, "%s: the live counts show %s, expected one more %s block", what,
           grown < 0 ? "no single new block" : kind_names[grown], kind_names[k]);
    if (k == KIND_SMALL)
        CHECKF(usable == expected_class(size, align), "%s: usable size %zu, expected the class %zu", what, usable,
               expected_class(size, align));
    return usable;
}

typedef struct {
    void *p;
    size_t usable, align;
    uint64_t seed;
} live_block;

static int by_address(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const live_block *)a)->p, y = (uintptr_t)((const live_block *)b)->p;
    return (x > y) - (x < y);
}

/* The usable ranges of the n blocks do not overlap (sorts the array by address). */
static void check_disjoint(live_block *blocks, size_t n, const char *what)
{
    qsort(blocks, n, sizeof *blocks, by_address);
    for (size_t i = 1; i < n; i++)
        CHECKF((uintptr_t)blocks[i - 1].p + blocks[i - 1].usable <= (uintptr_t)blocks[i].p,
               "%s: block %p of %zu usable bytes overlaps the block at %p", what, blocks[i - 1].p,
               blocks[i - 1].usable, blocks[i].p);
}

/* Sizes around the boundaries: the small classes, the small/medium limit, medium sizes, the medium/large
 * limit, large sizes. */
static const size_t boundary_sizes[] = {
    0, 1, 15, 16, 17, 63, 64, 65, 111, 112, 113, 127, 128, 129, 1023, 1024, 1025, 2047, 2048, 2049,
    4095, 4096, 4097, 8191, 8192, 8193, 16383, 16384, 16385, 20000, 100000, 1048575, 1048576, 1048577,
    4 * MB, 10 * MB,
};
#define BOUNDARY_COUNT (sizeof boundary_sizes / sizeof boundary_sizes[0])

/* ---- allocation: alignment, kind, size, contents ---- */

/* Every alignment with every boundary size, all live at once: each block aligned, of its kind, usable
 * for its size, writable over its whole usable size; no two overlap; all intact at the end. */
TEST(every_alignment_and_size_gives_an_aligned_writable_block_of_its_kind)
{
    enum { COUNT = ALIGN_COUNT * BOUNDARY_COUNT };
    static live_block blocks[COUNT];
    live_counts start = live_now();
    size_t n = 0;
    char what[96];
    for (int a = 0; a < ALIGN_COUNT; a++) {
        size_t align = (size_t)1 << a;
        for (size_t i = 0; i < BOUNDARY_COUNT; i++) {
            size_t size = boundary_sizes[i];
            snprintf(what, sizeof what, "shard_malloc_aligned(%zu, %zu)", size, align);
            live_counts before = live_now();
            void *p = shard_malloc_aligned(size, align);
            size_t usable = check_new_block(p, size, align, before, what);
            if (p == NULL)
                continue;
            blocks[n].p = p;
            blocks[n].usable = usable;
            blocks[n].seed = 0xa1000 + n;
            fill_block(p, usable, blocks[n].seed);
            n++;
        }
    }
    CHECK_EQ(n, COUNT);
    check_allocator("with every aligned block live");
    check_disjoint(blocks, n, "aligned blocks");
    for (size_t i = 0; i < n; i++) {
        snprintf(what, sizeof what, "aligned block %p of %zu usable bytes", blocks[i].p, blocks[i].usable);
        check_contents(blocks[i].p, blocks[i].usable, blocks[i].seed, what);
        CHECKF(shard_usable_size(blocks[i].p) == blocks[i].usable, "%s: usable size changed to %zu", what,
               shard_usable_size(blocks[i].p));
        shard_free(blocks[i].p);
    }
    check_end(start, "after freeing every aligned block");
}

/* Every size from 0 to 16 KB at every alignment up to 16 KB: exactly the smallest class that is a
 * multiple of the alignment, at an aligned address. */
TEST(small_requests_take_the_smallest_class_that_is_a_multiple_of_align)
{
    live_counts start = live_now();
    for (size_t align = 1; align <= SMALL_MAX; align <<= 1) {
        for (size_t size = 0; size <= SMALL_MAX; size++) {
            unsigned char *p = shard_malloc_aligned(size, align);
            size_t usable = shard_usable_size(p), cls = expected_class(size, align);
            CHECKF(p != NULL && is_aligned(p, effective_align(align)) && usable == cls,
                   "shard_malloc_aligned(%zu, %zu) = %p, usable size %zu, expected the class %zu", size, align,
                   (void *)p, usable, cls);
            if (p == NULL)
                continue;
            p[0] = 1;
            p[usable - 1] = 2;
            shard_free(p);
        }
    }
    check_end(start, "after the small aligned blocks");
}

/* Alignments that are not a power of two, 0, and 2^63 (no address space holds it) give NULL and
 * allocate nothing; shard_realloc_aligned with one gives NULL and leaves the block as it was. */
TEST(impossible_alignments_give_null_and_leave_the_block)
{
    static const size_t aligns[] = {
        0, 3, 5, 12, 24, 48, 100, 4095, 4097, 3 * MB, ALIGN_MAX + 16, (SIZE_MAX >> 1) + 1, SIZE_MAX,
    };
    static const size_t sizes[] = { 0, 1, 100, 16384, 20000, MB, 2 * MB };
    live_counts start = live_now();
    unsigned char *p = shard_malloc_aligned(3000, 64);
    CHECK(p != NULL);
    if (p == NULL)
        return;
    size_t usable = shard_usable_size(p);
    fill_block(p, usable, 0xb100);
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            void *q = shard_malloc_aligned(sizes[s], aligns[a]);
            CHECKF(q == NULL, "shard_malloc_aligned(%zu, %zu) = %p", sizes[s], aligns[a], q);
            q = shard_realloc_aligned(NULL, sizes[s], aligns[a]);
            CHECKF(q == NULL, "shard_realloc_aligned(NULL, %zu, %zu) = %p", sizes[s], aligns[a], q);
            if (sizes[s] == 0)
                continue; /* size 0 with an impossible align: the header leaves open whether p is freed */
            q = shard_realloc_aligned(p, sizes[s], aligns[a]);
            CHECKF(q == NULL, "shard_realloc_aligned(p, %zu, %zu) = %p", sizes[s], aligns[a], q);
        }
    }
    CHECK_EQ(shard_usable_size(p), usable);
    check_contents(p, usable, 0xb100, "a block given to shard_realloc_aligned with impossible alignments");
    shard_free(p);
    check_end(start, "after impossible alignments");
}

/* Sizes no allocation can satisfy give NULL at every alignment, report out of memory and allocate
 * nothing; shard_realloc_aligned to such a size leaves the block as it was. */
TEST(impossible_sizes_give_null_and_report_out_of_memory)
{
    static const size_t sizes[] = { SIZE_MAX, SIZE_MAX - PAGE_BYTES, SIZE_MAX - ALIGN_MAX, (size_t)1 << 62,
                                    (size_t)1 << 50 };
    static const size_t aligns[] = { 1, 16, 64, 4096, 16384, 65536, MB, ALIGN_MAX };
    live_counts start = live_now();
    unsigned char *p = shard_malloc_aligned(50000, 4096);
    CHECK(p != NULL);
    if (p == NULL)
        return;
    size_t usable = shard_usable_size(p);
    fill_block(p, usable, 0xb200);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
            oom_clear();
            void *q = shard_malloc_aligned(sizes[s], aligns[a]);
            CHECKF(q == NULL && oom_reported(), "shard_malloc_aligned(%zu, %zu) = %p, out of memory %sreported",
                   sizes[s], aligns[a], q, oom_reported() ? "" : "not ");
            q = shard_realloc_aligned(p, sizes[s], aligns[a]);
            CHECKF(q == NULL, "shard_realloc_aligned(p, %zu, %zu) = %p", sizes[s], aligns[a], q);
        }
    }
    CHECK_EQ(shard_usable_size(p), usable);
    check_contents(p, usable, 0xb200, "a block given to shard_realloc_aligned with impossible sizes");
    shard_free(p);
    check_end(start, "after impossible sizes");
}

/* ---- realloc ---- */

/* A request that makes a block of each kind at an alignment. */
typedef struct {
    size_t size, align;
} request;

static const request kinds_of_aligned_blocks[] = {
    { 100, 64 },       /* small, class 128 */
    { 3000, 4096 },    /* small, class 4096 */
    { 5000, 16384 },   /* small, class 16384 */
    { 100, 65536 },    /* medium: the alignment is above 16 KB */
    { 50000, 4096 },   /* medium */
    { 700000, MB },    /* medium */
    { MB, ALIGN_MAX }, /* medium */
    { 2 * MB, 64 },    /* large */
    { 3 * MB, MB },    /* large */
    { 5 * MB, ALIGN_MAX }, /* large */
};
#define KINDS_COUNT (sizeof kinds_of_aligned_blocks / sizeof kinds_of_aligned_blocks[0])

/* shard_realloc takes an aligned block of any kind like any other: to every size the contents are kept
 * up to the smaller of the old usable size and the new size (24 MB is beyond a large block's
 * reservation: it moves, on Linux with its pages). */
TEST(realloc_of_an_aligned_block_keeps_its_contents)
{
    static const size_t targets[] = { 1, 50, 128, 10000, 16385, 500000, MB + 1, 3 * MB, 7 * MB, 24 * MB };
    live_counts start = live_now();
    char what[96];
    for (size_t k = 0; k < KINDS_COUNT; k++) {
        for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
            request r = kinds_of_aligned_blocks[k];
            uint64_t seed = 0xc100 + 16 * k + t;
            shard_collect(); /* no cached large block: a fresh one's reservation is too small for 24 MB */
            unsigned char *p = shard_malloc_aligned(r.size, r.align);
            CHECK(p != NULL);
            if (p == NULL)
                continue;
            size_t usable = shard_usable_size(p);
            fill_block(p, usable, seed);
            unsigned char *q = shard_realloc(p, targets[t]);
            snprintf(what, sizeof what, "shard_realloc(aligned(%zu, %zu), %zu)", r.size, r.align, targets[t]);
            CHECKF(q != NULL, "%s: NULL", what);
            if (q == NULL) {
                shard_free(p);
                continue;
            }
            size_t now = shard_usable_size(q);
            CHECKF(now >= targets[t], "%s: usable size %zu", what, now);
            check_contents(q, usable < targets[t] ? usable : targets[t], seed, what);
            fill_block(q, now, seed + 1);
            check_contents(q, now, seed + 1, what);
            shard_free(q);
        }
    }
    check_end(start, "after realloc of aligned blocks");
}

/* shard_realloc_aligned through every kind and back, at alignments from 32 B to 2 MB: every result is
 * aligned and usable for its size, and holds the contents up to the smaller of the old usable size and
 * the new size. */
TEST(realloc_aligned_keeps_alignment_and_contents_across_kinds)
{
    static const size_t aligns[] = { 32, 64, 256, 4096, 16384, 65536, MB, ALIGN_MAX };
    static const size_t steps[] = {
        100, 5000, 16384, 16385, 50000, MB, MB + 1, 4 * MB, 10 * MB, 3 * MB, MB + 1, MB, 200000, 20000,
        16384, 3000, 1, 100, 3 * MB, 100,
    };
    live_counts start = live_now();
    char what[96];
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
        size_t align = aligns[a], usable = 0;
        unsigned char *p = NULL;
        uint64_t seed = 0;
        for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
            size_t size = steps[s];
            unsigned char *q = shard_realloc_aligned(p, size, align);
            snprintf(what, sizeof what, "shard_realloc_aligned(%zu -> %zu, %zu)", s ? steps[s - 1] : 0, size, align);
            CHECKF(q != NULL, "%s: NULL", what);
            if (q == NULL)
                break;
            size_t now = shard_usable_size(q);
            CHECKF(is_aligned(q, align), "%s = %p: not aligned", what, (void *)q);
            CHECKF(now >= size, "%s: usable size %zu", what, now);
            if (p != NULL)
                check_contents(q, usable < size ? usable : size, seed, what);
            p = q;
            usable = now;
            seed = 0xc200 + 64 * a + s;
            fill_block(p, usable, seed);
        }
        if (p == NULL)
            continue;
        check_contents(p, usable, seed, "the last block of a realloc_aligned chain");
        CHECK(shard_realloc_aligned(p, 0, align) == NULL); /* frees */
        check_live_back(start, "after a realloc_aligned chain ended by size 0");
    }
    check_end(start, "after realloc_aligned across kinds");
}

/* shard_realloc_aligned stays in place: a small block within its class and not below a quarter of it;
 * a medium or large block that shrinks, and one that grows into the room it freed. shard_realloc of a
 * shrinking large aligned block stays in place too (and so keeps the alignment). */
TEST(realloc_aligned_stays_in_place_when_it_can)
{
    live_counts start = live_now();
    char what[96];
    /* Small: aligned(65, 64) is of class 128. */
    unsigned char *p = shard_malloc_aligned(65, 64);
    CHECK(p != NULL && shard_usable_size(p) == 128);
    if (p != NULL) {
        fill_block(p, 128, 0xc300);
        CHECK(shard_realloc_aligned(p, 128, 64) == p);
        CHECK(shard_realloc_aligned(p, 40, 64) == p);
        CHECK(shard_realloc_aligned(p, 100, 64) == p);
        CHECK_EQ(shard_usable_size(p), 128);
        check_contents(p, 128, 0xc300, "small aligned block resized in place");
        shard_free(p);
    }
    /* Small: aligned(100, 4096) is of class 4096. */
    p = shard_malloc_aligned(100, 4096);
    CHECK(p != NULL && shard_usable_size(p) == 4096);
    if (p != NULL) {
        fill_block(p, 4096, 0xc301);
        CHECK(shard_realloc_aligned(p, 4096, 4096) == p);
        CHECK(shard_realloc_aligned(p, 1024, 4096) == p);
        check_contents(p, 4096, 0xc301, "small aligned block of class 4096 resized in place");
        shard_free(p);
    }
    /* Medium: shrink, then grow into the room the shrink gave back. */
    static const request medium[] = { { 600000, 65536 }, { 600000, 4096 }, { 900000, MB }, { 300000, 64 } };
    for (size_t i = 0; i < sizeof medium / sizeof medium[0]; i++) {
        size_t align = medium[i].align;
        p = shard_malloc_aligned(medium[i].size, align);
        CHECK(p != NULL);
        if (p == NULL)
            continue;
        size_t usable = shard_usable_size(p);
        fill_block(p, usable, 0xc310 + i);
        snprintf(what, sizeof what, "medium aligned(%zu, %zu)", medium[i].size, align);
        unsigned char *q = shard_realloc_aligned(p, 100000, align);
        CHECKF(q == p, "%s shrunk to 100000: %p, was %p", what, (void *)q, (void *)p);
        size_t shrunk = shard_usable_size(p);
        CHECKF(shrunk >= 100000 && shrunk < usable, "%s shrunk to 100000: usable size %zu of %zu", what, shrunk, usable);
        q = shard_realloc_aligned(p, 250000, align);
        CHECKF(q == p, "%s grown back to 250000: %p, was %p", what, (void *)q, (void *)p);
        CHECKF(shard_usable_size(p) >= 250000, "%s grown back: usable size %zu", what, shard_usable_size(p));
        check_contents(p, 100000, 0xc310 + i, what);
        shard_free(p);
    }
    /* Large: shrink, grow within the reservation; plain shard_realloc shrinking too. */
    static const request large[] = { { 8 * MB, ALIGN_MAX }, { 8 * MB, 4096 }, { 6 * MB, 64 } };
    for (size_t i = 0; i < sizeof large / sizeof large[0]; i++) {
        size_t align = large[i].align;
        p = shard_malloc_aligned(large[i].size, align);
        CHECK(p != NULL);
        if (p == NULL)
            continue;
        size_t usable = shard_usable_size(p);
        fill_block(p, usable, 0xc320 + i);
        snprintf(what, sizeof what, "large aligned(%zu, %zu)", large[i].size, align);
        unsigned char *q = shard_realloc_aligned(p, 3 * MB, align);
        CHECKF(q == p, "%s shrunk to 3 MB: %p, was %p", what, (void *)q, (void *)p);
        CHECKF(shard_usable_size(p) >= 3 * MB && shard_usable_size(p) < usable, "%s shrunk: usable size %zu", what,
               shard_usable_size(p));
        q = shard_realloc_aligned(p, 7 * MB, align);
        CHECKF(q == p, "%s grown to 7 MB: %p, was %p", what, (void *)q, (void *)p);
        CHECKF(shard_usable_size(p) >= 7 * MB, "%s grown: usable size %zu", what, shard_usable_size(p));
        q = shard_realloc(p, 2 * MB);
        CHECKF(q == p, "shard_realloc of %s to 2 MB: %p, was %p", what, (void *)q, (void *)p);
        check_contents(p, 2 * MB, 0xc320 + i, what);
        shard_free(p);
    }
    check_end(start, "after in-place realloc_aligned");
}

/* shard_realloc_aligned of NULL allocates an aligned block of the expected kind; to size 0 it frees the
 * block and returns NULL. */
TEST(realloc_aligned_of_null_allocates_and_to_zero_frees)
{
    live_counts start = live_now();
    char what[96];
    for (size_t k = 0; k < KINDS_COUNT; k++) {
        request r = kinds_of_aligned_blocks[k];
        snprintf(what, sizeof what, "shard_realloc_aligned(NULL, %zu, %zu)", r.size, r.align);
        live_counts before = live_now();
        void *p = shard_realloc_aligned(NULL, r.size, r.align);
        size_t usable = check_new_block(p, r.size, r.align, before, what);
        if (p == NULL)
            continue;
        fill_block(p, usable, 0xc400 + k);
        check_contents(p, usable, 0xc400 + k, what);
        CHECK(shard_realloc_aligned(p, 0, r.align) == NULL);
        check_live_back(before, "after shard_realloc_aligned(p, 0, align)");
    }
    /* An alignment of 16 or less is shard_realloc's: the same two rules. */
    void *p = shard_realloc_aligned(NULL, 100, 8);
    CHECK(p != NULL && is_aligned(p, 16));
    CHECK(shard_realloc_aligned(p, 0, 8) == NULL);
    check_end(start, "after realloc_aligned of NULL and to 0");
}

/* A block that is not at a multiple of the alignment asked for moves to one that is, with its contents:
 * an ordinary block of each kind, and aligned blocks asked for a larger alignment. */
TEST(realloc_aligned_moves_a_block_to_a_larger_alignment)
{
    static const size_t sizes[] = { 100, 3000, 50000, 3 * MB };
    static const size_t aligns[] = { 64, 4096, 65536, ALIGN_MAX };
    live_counts start = live_now();
    char what[96];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
            uint64_t seed = 0xc500 + 8 * s + a;
            unsigned char *p = shard_malloc(sizes[s]);
            CHECK(p != NULL);
            if (p == NULL)
                continue;
            size_t usable = shard_usable_size(p);
            fill_block(p, usable, seed);
            /* Twice: from the ordinary block, then from an aligned one to twice the alignment. */
            for (int round = 0; round < 2; round++) {
                size_t align = aligns[a] << round;
                unsigned char *q = shard_realloc_aligned(p, sizes[s], align);
                snprintf(what, sizeof what, "shard_realloc_aligned(%s block of %zu, %zu, %zu)",
                         round ? "aligned" : "ordinary", usable, sizes[s], align);
                CHECKF(q != NULL && is_aligned(q, align), "%s = %p", what, (void *)q);
                if (q == NULL)
                    break;
                check_contents(q, usable < sizes[s] ? usable : sizes[s], seed, what);
                p = q;
                usable = shard_usable_size(p);
                fill_block(p, usable, seed);
                if (align == ALIGN_MAX)
                    break; /* 4 MB would be an impossible alignment */
            }
            shard_free(p);
        }
    }
    check_end(start, "after moves to larger alignments");
}

/* ---- the error hook ---- */

/* Frees, reallocs (plain and aligned) and size-queries bad; each reaches the hook once. */
static void check_bad_pointer(void *bad, const char *what)
{
    char msg[128];
    hook_reset();
    shard_free(bad);
    snprintf(msg, sizeof msg, "shard_free(%s)", what);
    CHECK_HOOK(SHARD_ERROR_INVALID_FREE, bad, msg);
    hook_reset();
    size_t n = shard_usable_size(bad);
    snprintf(msg, sizeof msg, "shard_usable_size(%s)", what);
    CHECKF(n == 0, "%s = %zu", msg, n);
    CHECK_HOOK(SHARD_ERROR_INVALID_SIZE_QUERY, bad, msg);
    static const size_t sizes[] = { 100, 50000, 3 * MB };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        hook_reset();
        void *q = shard_realloc(bad, sizes[i]);
        snprintf(msg, sizeof msg, "shard_realloc(%s, %zu)", what, sizes[i]);
        CHECKF(q == NULL, "%s = %p", msg, q);
        CHECK_HOOK(SHARD_ERROR_INVALID_REALLOC, bad, msg);
        hook_reset();
        q = shard_realloc_aligned(bad, sizes[i], 4096);
        snprintf(msg, sizeof msg, "shard_realloc_aligned(%s, %zu, 4096)", what, sizes[i]);
        CHECKF(q == NULL, "%s = %p", msg, q);
        CHECK_HOOK(SHARD_ERROR_INVALID_REALLOC, bad, msg);
    }
}

/* Pointers into aligned blocks that are not their start (p + 16; for medium and large blocks p - 16,
 * and for a large block with an offset, where an ordinary large block would start) reach the hook from
 * free, realloc, realloc_aligned and usable_size; the blocks keep their contents and size. */
TEST(interior_pointers_of_aligned_blocks_reach_the_error_hook_and_change_nothing)
{
    enum { N = KINDS_COUNT };
    live_counts start = live_now();
    unsigned char *p[N];
    size_t usable[N];
    char what[96];
    int cookie = 0;
    for (size_t i = 0; i < N; i++) {
        p[i] = shard_malloc_aligned(kinds_of_aligned_blocks[i].size, kinds_of_aligned_blocks[i].align);
        CHECK(p[i] != NULL);
        if (p[i] == NULL)
            return;
        usable[i] = shard_usable_size(p[i]);
        fill_block(p[i], usable[i], 0xd100 + i);
    }
    shard_error_fn previous = shard_set_error_hook(recording_hook, &cookie);
    for (size_t i = 0; i < N; i++) {
        request r = kinds_of_aligned_blocks[i];
        enum kind k = expected_kind(r.size, r.align);
        snprintf(what, sizeof what, "%s aligned(%zu, %zu) + 16", kind_names[k], r.size, r.align);
        check_bad_pointer(p[i] + 16, what);
        if (k == KIND_SMALL)
            continue; /* p - 16 may be another live item */
        snprintf(what, sizeof what, "%s aligned(%zu, %zu) - 16", kind_names[k], r.size, r.align);
        check_bad_pointer(p[i] - 16, what);
        uintptr_t granule = (uintptr_t)p[i] & ~(uintptr_t)(4 * MB - 1);
        if (k == KIND_LARGE && (uintptr_t)p[i] - granule > 32) {
            snprintf(what, sizeof what, "large aligned(%zu, %zu): an ordinary block's start", r.size, r.align);
            check_bad_pointer((void *)(granule + 32), what);
        }
    }
    CHECK(hook_record.arg == &cookie);
    hook_reset();
    for (size_t i = 0; i < N; i++) {
        snprintf(what, sizeof what, "aligned(%zu, %zu) after bad pointers into it", kinds_of_aligned_blocks[i].size,
                 kinds_of_aligned_blocks[i].align);
        CHECKF(shard_usable_size(p[i]) == usable[i], "%s: usable size %zu, was %zu", what, shard_usable_size(p[i]),
               usable[i]);
        check_contents(p[i], usable[i], 0xd100 + i, what);
        shard_free(p[i]);
    }
    CHECKF(hook_record.calls == 0, "valid calls reached the hook %d times", hook_record.calls);
    CHECK(shard_set_error_hook(previous, NULL) == recording_hook);
    check_end(start, "after interior pointers of aligned blocks");
}

/* A second free of an aligned medium or large block reaches the hook and changes nothing: its
 * neighbours keep their contents, and what is live stays counted. */
TEST(double_free_of_aligned_medium_and_large_blocks_reaches_the_error_hook)
{
    static const request freed[] = { { 50000, 4096 }, { 300000, 65536 }, { 100, 65536 }, { MB, ALIGN_MAX },
                                      { 3 * MB, ALIGN_MAX }, { 5 * MB, 64 } };
    live_counts start = live_now();
    char what[96];
    shard_error_fn previous = shard_set_error_hook(recording_hook, NULL);
    for (size_t i = 0; i < sizeof freed / sizeof freed[0]; i++) {
        request r = freed[i];
        /* neighbours before and after (in a medium arena: around it) */
        unsigned char *before = shard_malloc_aligned(r.size, r.align);
        unsigned char *p = shard_malloc_aligned(r.size, r.align);
        unsigned char *after = shard_malloc_aligned(r.size, r.align);
        CHECK(before != NULL && p != NULL && after != NULL);
        if (before == NULL || p == NULL || after == NULL)
            break;
        size_t ub = shard_usable_size(before), ua = shard_usable_size(after);
        fill_block(before, ub, 0xd200 + i);
        fill_block(after, ua, 0xd280 + i);
        fill_block(p, shard_usable_size(p), 0xd2c0 + i);
        shard_free(p);
        live_counts freed_once = live_now();
        hook_reset();
        shard_free(p);
        snprintf(what, sizeof what, "second free of aligned(%zu, %zu)", r.size, r.align);
        CHECK_HOOK(SHARD_ERROR_INVALID_FREE, p, what);
        hook_reset();
        CHECK(shard_realloc_aligned(p, 100, 64) == NULL);
        CHECK_HOOK(SHARD_ERROR_INVALID_REALLOC, p, what);
        check_live_back(freed_once, what);
        check_allocator(what);
        check_contents(before, ub, 0xd200 + i, what);
        check_contents(after, ua, 0xd280 + i, what);
        /* A new block of the size takes the freed room once: it overlaps neither neighbour. */
        unsigned char *again = shard_malloc_aligned(r.size, r.align);
        CHECK(again != NULL);
        if (again != NULL) {
            fill_block(again, shard_usable_size(again), 0xd2f0 + i);
            check_contents(before, ub, 0xd200 + i, what);
            check_contents(after, ua, 0xd280 + i, what);
            shard_free(again);
        }
        shard_free(before);
        shard_free(after);
    }
    CHECK(shard_set_error_hook(previous, NULL) == recording_hook);
    check_end(start, "after double frees of aligned blocks");
}

/* ---- other threads ---- */

enum { HANDOVER_MAX = 64 };
typedef struct {
    live_block blocks[HANDOVER_MAX];
    size_t count;
    uint64_t seed;
} handover;

/* Allocates aligned blocks of every kind into h, filled with their patterns. */
static void *allocate_handover(void *arg)
{
    handover *h = arg;
    static const size_t aligns[] = { 32, 4096, 16384, 65536, MB, ALIGN_MAX };
    static const size_t sizes[] = { 1, 200, 16384, 30000, 300000, MB, MB + 1, 3 * MB };
    h->count = 0;
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0] && h->count < HANDOVER_MAX; s++) {
            void *p = shard_malloc_aligned(sizes[s], aligns[a]);
            CHECKF(p != NULL && is_aligned(p, aligns[a]), "shard_malloc_aligned(%zu, %zu) = %p", sizes[s], aligns[a], p);
            if (p == NULL)
                continue;
            live_block *b = &h->blocks[h->count++];
            b->p = p;
            b->usable = shard_usable_size(p);
            b->align = aligns[a];
            b->seed = h->seed + h->count;
            fill_block(p, b->usable, b->seed);
        }
    }
    return NULL;
}

/* Checks every block of h and frees it. */
static void *free_handover(void *arg)
{
    handover *h = arg;
    for (size_t i = 0; i < h->count; i++) {
        live_block *b = &h->blocks[i];
        CHECKF(shard_usable_size(b->p) == b->usable, "block %p of another thread: usable size %zu, was %zu", b->p,
               shard_usable_size(b->p), b->usable);
        check_contents(b->p, b->usable, b->seed, "an aligned block of another thread");
        shard_free(b->p);
    }
    h->count = 0;
    return NULL;
}

/* Moves every block of h with shard_realloc_aligned to a larger size at the same alignment. */
static void *grow_handover(void *arg)
{
    handover *h = arg;
    for (size_t i = 0; i < h->count; i++) {
        live_block *b = &h->blocks[i];
        size_t align = b->align, size = b->usable + b->usable / 2 + 100;
        void *q = shard_realloc_aligned(b->p, size, align);
        CHECKF(q != NULL && is_aligned(q, align), "shard_realloc_aligned(%p, %zu, %zu) in another thread = %p", b->p,
               size, align, q);
        if (q == NULL)
            continue;
        check_contents(q, b->usable, b->seed, "an aligned block grown by another thread");
        b->p = q;
        b->usable = shard_usable_size(q);
        fill_block(q, b->usable, b->seed);
    }
    return NULL;
}

/* Aligned blocks of every kind freed by a thread other than their owner, while the owner runs and after
 * it ended, and grown with shard_realloc_aligned by another thread: contents intact, nothing left live. */
TEST(aligned_blocks_freed_and_resized_by_another_thread)
{
    static handover h;
    live_counts start = live_now();
    /* Allocated here, freed by another thread; the owner takes its blocks back at its next operation. */
    h.seed = 0xe100;
    allocate_handover(&h);
    run_thread(free_handover, &h);
    shard_free(shard_malloc_aligned(30000, 4096)); /* a medium operation takes the foreign frees in */
    check_live_back(start, "after another thread freed this thread's aligned blocks");
    check_allocator("after another thread freed this thread's aligned blocks");
    /* Allocated here, grown by another thread (it cannot resize this thread's medium blocks in place),
     * then freed here. */
    h.seed = 0xe200;
    allocate_handover(&h);
    run_thread(grow_handover, &h);
    free_handover(&h);
    /* Allocated by a thread that ends, freed here. */
    h.seed = 0xe300;
    run_thread(allocate_handover, &h);
    CHECK(h.count > 0);
    free_handover(&h);
    check_end(start, "after aligned blocks changed threads");
}

/* ---- aligned allocation after the thread-exit hook ---- */

/* A thread-local destructor that runs after the allocator's exit hook (platform.h's after_exit_arm)
 * allocates aligned blocks of every kind: a small and a medium one need a heap, which the thread borrows
 * for the one block and gives straight back. The blocks are good and outlive the thread, and no heap
 * stays behind. */
enum { LATE_THREADS = 6 };
static const request late_requests[] = { { 100, 64 }, { 50000, 4096 }, { 100, 65536 }, { 300000, MB }, { 3 * MB, MB } };
#define LATE_COUNT (sizeof late_requests / sizeof late_requests[0])

static struct {
    live_block blocks[LATE_THREADS][LATE_COUNT];
    size_t count[LATE_THREADS];
} late;

/* platform.h's after_exit_action: every request, once. */
static void after_exit_action(int thread)
{
    for (size_t i = late.count[thread]; i < LATE_COUNT; i++) {
        request r = late_requests[i];
        void *p = shard_malloc_aligned(r.size, r.align);
        CHECKF(p != NULL && is_aligned(p, r.align), "shard_malloc_aligned(%zu, %zu) after the exit hook = %p", r.size,
               r.align, p);
        if (p == NULL)
            return;
        live_block *b = &late.blocks[thread][i];
        b->p = p;
        b->usable = shard_usable_size(p);
        b->align = r.align;
        b->seed = 0xe400 + 16 * (uint64_t)thread + i;
        fill_block(p, b->usable, b->seed);
        late.count[thread]++;
    }
}

static void *late_thread(void *arg)
{
    void *p = shard_malloc(100); /* the thread has a heap of its own, and so an exit hook to run */
    CHECK(p != NULL);
    shard_free(p);
    after_exit_arm((int)(intptr_t)arg);
    return NULL;
}

TEST(aligned_allocations_after_the_thread_exit_hook_leave_no_heap_behind)
{
    live_counts start = live_now();
    void *mine = shard_malloc(100); /* the main thread holds a heap throughout */
    CHECK(mine != NULL);
    CHECK_EQ(after_exit_setup(1), 0);
    size_t heaps_before = stats_now().heaps;
    for (int i = 0; i < LATE_THREADS; i++)
        run_thread(late_thread, (void *)(intptr_t)i); /* one after another: one heap can serve them all */
    shard_stats s = stats_now();
    CHECKF(s.heaps - s.heaps_free == 1, "%zu heaps, %zu of them free, after %d threads that allocated late", s.heaps,
           s.heaps_free, LATE_THREADS);
    CHECKF(s.heaps <= heaps_before + 1, "%zu heaps before, %zu after %d threads one after another", heaps_before,
           s.heaps, LATE_THREADS);
    for (int i = 0; i < LATE_THREADS; i++) {
        CHECKF(late.count[i] == LATE_COUNT, "thread %d made %zu of %zu late blocks", i, late.count[i],
               (size_t)LATE_COUNT);
        for (size_t k = 0; k < late.count[i]; k++) {
            live_block *b = &late.blocks[i][k];
            CHECK_EQ(shard_usable_size(b->p), b->usable);
            check_contents(b->p, b->usable, b->seed, "an aligned block made after the exit hook");
            shard_free(b->p);
        }
    }
    shard_free(mine);
    check_end(start, "after aligned allocations after the exit hook");
}

/* Alignments of 4 MB and more: a large block at the alignment, whatever the size, usable as asked,
 * resized in place or moved (shard_realloc_aligned keeps the alignment), freed; each takes its
 * alignment again in address space while it lives, and gives all of it back at its free (such blocks
 * are not cached). */
TEST(alignments_of_4mb_and_more_give_large_blocks_that_start_a_granule)
{
    static const size_t aligns[] = { 2 * ALIGN_MAX, 16 * MB, 64 * MB, (size_t)1 << 30 };
    static const size_t sizes[] = { 0, 1, 100, 20000, MB, 3 * MB + 5 };
    live_counts start = live_now();
    char what[96];
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            size_t align = aligns[a], size = sizes[s];
            snprintf(what, sizeof what, "shard_malloc_aligned(%zu, %zu)", size, align);
            shard_stats was = stats_now();
            live_counts before = live_now();
            unsigned char *p = shard_malloc_aligned(size, align);
            size_t usable = check_new_block(p, size, align, before, what);
            if (p == NULL)
                continue;
            shard_stats held = stats_now();
            CHECKF(held.reserved - was.reserved >= align + size, "%s: %zu bytes reserved for it", what,
                   held.reserved - was.reserved);
            fill_block(p, usable, 0xf000 + a * 16 + s);
            unsigned char *q = shard_realloc_aligned(p, size + 5 * MB, align);
            CHECKF(q != NULL && is_aligned(q, align), "%s grown by 5 MB: %p", what, (void *)q);
            if (q == NULL) {
                shard_free(p);
                continue;
            }
            check_contents(q, usable, 0xf000 + a * 16 + s, what);
            CHECK(shard_usable_size(q) >= size + 5 * MB);
            unsigned char *r = shard_realloc(q, size + 9 * MB); /* may drop the alignment, keeps the bytes */
            CHECKF(r != NULL, "%s grown again by shard_realloc", what);
            if (r != NULL) {
                check_contents(r, usable, 0xf000 + a * 16 + s, what);
                q = r;
            }
            shard_free(q);
            shard_collect(); /* the moved block's reservation waits in the large cache: empty it */
            shard_stats freed = stats_now();
            CHECKF(freed.reserved <= was.reserved, "%s: after its free %zu bytes reserved, %zu before", what,
                   freed.reserved, was.reserved);
        }
    }
    check_end(start, "after alignments of 4 MB and more");
}

/* ---- the shard_ names of glibc's malloc family ---- */

/* shard_posix_memalign: 22 and *out untouched for align 0, below sizeof(void *) or not a power of two;
 * 12 and *out untouched for an impossible size or alignment; 0 and an aligned block otherwise. */
TEST(posix_memalign_rejects_bad_alignments_and_sets_out_only_on_success)
{
    static const size_t bad[] = { 0, 1, 2, 3, 4, 12, 24, 40, 48, 100, 4095, ALIGN_MAX + 8, 3 * ALIGN_MAX, SIZE_MAX };
    static const size_t sizes[] = { 0, 1, 100, 16384, 20000, MB, 2 * MB };
    live_counts start = live_now();
    char what[96];
    void *sentinel = &start, *out;
    for (size_t a = 0; a < sizeof bad / sizeof bad[0]; a++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            out = sentinel;
            int rc = shard_posix_memalign(&out, bad[a], sizes[s]);
            CHECKF(rc == EINVAL_CODE && out == sentinel, "shard_posix_memalign(%zu, %zu) = %d, out %p", bad[a],
                   sizes[s], rc, out);
        }
    }
    check_live_back(start, "after posix_memalign with bad alignments");
    out = sentinel;
    int no_room = shard_posix_memalign(&out, (SIZE_MAX >> 1) + 1, 100);
    CHECKF(no_room == ENOMEM_CODE && out == sentinel, "shard_posix_memalign(2^63, 100) = %d, out %p", no_room, out);
    for (size_t align = sizeof(void *); align <= ALIGN_MAX; align <<= 1) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            snprintf(what, sizeof what, "shard_posix_memalign(%zu, %zu)", align, sizes[s]);
            out = sentinel;
            live_counts before = live_now();
            int rc = shard_posix_memalign(&out, align, sizes[s]);
            CHECKF(rc == 0 && out != sentinel, "%s = %d", what, rc);
            if (rc != 0 || out == sentinel)
                continue;
            size_t usable = check_new_block(out, sizes[s], align, before, what);
            fill_block(out, usable, 0xf100 + align + s);
            check_contents(out, usable, 0xf100 + align + s, what);
            shard_free(out);
        }
        out = sentinel;
        int rc = shard_posix_memalign(&out, align, SIZE_MAX - PAGE_BYTES);
        CHECKF(rc == ENOMEM_CODE && out == sentinel, "shard_posix_memalign(%zu, SIZE_MAX - 4096) = %d, out %p",
               align, rc, out);
    }
    check_end(start, "after posix_memalign");
}

/* shard_memalign and shard_aligned_alloc: an alignment below 16 is 16, one that is not a power of two
 * rounds up to the next one; above 2^63, or an impossible size, NULL. */
TEST(memalign_and_aligned_alloc_round_the_alignment_up)
{
    static const struct {
        size_t asked, given;
    } rounding[] = {
        { 0, 16 }, { 1, 16 }, { 2, 16 }, { 8, 16 }, { 16, 16 }, { 17, 32 }, { 24, 32 }, { 33, 64 },
        { 48, 64 }, { 100, 128 }, { 3000, 4096 }, { 4095, 4096 }, { 4097, 8192 }, { 20000, 32768 },
        { MB + 1, ALIGN_MAX }, { ALIGN_MAX - 1, ALIGN_MAX }, { ALIGN_MAX, ALIGN_MAX },
    };
    static const size_t sizes[] = { 0, 1, 100, 5000, 16384, 20000, MB, 3 * MB };
    live_counts start = live_now();
    char what[96];
    for (int fn = 0; fn < 2; fn++) {
        const char *name = fn ? "shard_aligned_alloc" : "shard_memalign";
        for (size_t r = 0; r < sizeof rounding / sizeof rounding[0]; r++) {
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
                size_t asked = rounding[r].asked, given = rounding[r].given, size = sizes[s];
                snprintf(what, sizeof what, "%s(%zu, %zu)", name, asked, size);
                live_counts before = live_now();
                void *p = fn ? shard_aligned_alloc(asked, size) : shard_memalign(asked, size);
                size_t usable = check_new_block(p, size, given, before, what);
                if (p == NULL)
                    continue;
                fill_block(p, usable, 0xf200 + r);
                check_contents(p, usable, 0xf200 + r, what);
                shard_free(p);
            }
        }
        void *p = fn ? shard_aligned_alloc((SIZE_MAX >> 1) + 1, 100) : shard_memalign((SIZE_MAX >> 1) + 1, 100);
        CHECKF(p == NULL, "%s(2^63, 100) = %p", name, p);
        p = fn ? shard_aligned_alloc(SIZE_MAX, 100) : shard_memalign(SIZE_MAX, 100);
        CHECKF(p == NULL, "%s(SIZE_MAX, 100) = %p", name, p);
        oom_clear();
        p = fn ? shard_aligned_alloc(64, SIZE_MAX - PAGE_BYTES) : shard_memalign(64, SIZE_MAX - PAGE_BYTES);
        CHECKF(p == NULL && oom_reported(), "%s(64, SIZE_MAX - 4096) = %p, out of memory %sreported", name, p,
               oom_reported() ? "" : "not ");
    }
    check_end(start, "after memalign and aligned_alloc");
}

/* shard_valloc is page-aligned; shard_pvalloc too, with the size rounded up to whole pages (0 to one). */
TEST(valloc_and_pvalloc_give_page_aligned_whole_pages)
{
    static const size_t sizes[] = { 0, 1, 100, 4095, 4096, 4097, 12289, 16384, 16385, 20000, MB - 1, MB,
                                    MB + 1, 3 * MB + 5 };
    live_counts start = live_now();
    char what[96];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t size = sizes[s];
        snprintf(what, sizeof what, "shard_valloc(%zu)", size);
        live_counts before = live_now();
        void *p = shard_valloc(size);
        size_t usable = check_new_block(p, size, PAGE_BYTES, before, what);
        if (p != NULL) {
            fill_block(p, usable, 0xf300 + s);
            check_contents(p, usable, 0xf300 + s, what);
            shard_free(p);
        }
        size_t pages = size == 0 ? PAGE_BYTES : round_up(size, PAGE_BYTES);
        snprintf(what, sizeof what, "shard_pvalloc(%zu)", size);
        before = live_now();
        p = shard_pvalloc(size);
        usable = check_new_block(p, pages, PAGE_BYTES, before, what);
        if (p != NULL) {
            fill_block(p, usable, 0xf380 + s);
            check_contents(p, usable, 0xf380 + s, what);
            shard_free(p);
        }
    }
    static const size_t huge[] = { SIZE_MAX, SIZE_MAX - PAGE_BYTES + 1, SIZE_MAX - PAGE_BYTES, (size_t)1 << 62 };
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        oom_clear();
        void *p = shard_valloc(huge[i]);
        CHECKF(p == NULL && oom_reported(), "shard_valloc(%zu) = %p, out of memory %sreported", huge[i], p,
               oom_reported() ? "" : "not ");
        oom_clear();
        p = shard_pvalloc(huge[i]);
        CHECKF(p == NULL && oom_reported(), "shard_pvalloc(%zu) = %p, out of memory %sreported", huge[i], p,
               oom_reported() ? "" : "not ");
    }
    check_end(start, "after valloc and pvalloc");
}

/* shard_reallocarray: the product's overflow gives NULL, reports out of memory and leaves the block;
 * otherwise it is shard_realloc to count * size, NULL allocating and a zero product freeing. */
TEST(reallocarray_checks_the_product_and_keeps_the_block_on_overflow)
{
    static const struct {
        size_t count, size;
    } overflow[] = {
        { SIZE_MAX, 2 }, { 2, SIZE_MAX }, { (SIZE_MAX >> 1) + 1, 2 }, { (size_t)1 << 32, (size_t)1 << 32 },
        { SIZE_MAX / 3 + 1, 3 }, { SIZE_MAX, SIZE_MAX },
    };
    live_counts start = live_now();
    unsigned char *p = shard_reallocarray(NULL, 10, 100);
    CHECK(p != NULL && shard_usable_size(p) >= 1000);
    if (p == NULL)
        return;
    check_live_back((live_counts){ { start.n[0] + 1, start.n[1], start.n[2] } }, "after reallocarray(NULL, 10, 100)");
    size_t usable = shard_usable_size(p);
    fill_block(p, usable, 0xf400);
    for (size_t i = 0; i < sizeof overflow / sizeof overflow[0]; i++) {
        oom_clear();
        void *q = shard_reallocarray(p, overflow[i].count, overflow[i].size);
        CHECKF(q == NULL && oom_reported(), "shard_reallocarray(p, %zu, %zu) = %p, out of memory %sreported",
               overflow[i].count, overflow[i].size, q, oom_reported() ? "" : "not ");
        q = shard_reallocarray(NULL, overflow[i].count, overflow[i].size);
        CHECKF(q == NULL, "shard_reallocarray(NULL, %zu, %zu) = %p", overflow[i].count, overflow[i].size, q);
    }
    CHECK_EQ(shard_usable_size(p), usable);
    check_contents(p, usable, 0xf400, "a block after reallocarray overflows");
    unsigned char *q = shard_reallocarray(p, 3000, 10);
    CHECK(q != NULL && shard_usable_size(q) >= 30000);
    if (q == NULL) {
        shard_free(p);
        return;
    }
    check_contents(q, usable, 0xf400, "a block grown by reallocarray");
    q = shard_reallocarray(q, 1 << 20, 3); /* a large block */
    CHECK(q != NULL && shard_usable_size(q) >= 3 * MB);
    if (q == NULL)
        return;
    check_contents(q, usable, 0xf400, "a block grown by reallocarray to a large block");
    CHECK(shard_reallocarray(q, 0, 100) == NULL); /* frees */
    check_end(start, "after reallocarray");
}

/* ---- medium aligned blocks in a loop ---- */

/* Thousands of medium aligned blocks (align 4 KB .. 1 MB, sizes 20 KB .. 1 MB), eight live at a time:
 * the room in front of each block goes back to the arena, so the number of arenas stays bounded and the
 * arenas stay consistent; the first and last bytes of every block are intact until its free. */
TEST(medium_aligned_blocks_give_back_the_room_in_front_of_them)
{
    enum { ROUNDS = 4000, KEEP = 8, ENDS = 256, ARENAS_MAX = 12 };
    live_counts start = live_now();
    shard_stats s0 = stats_now();
    size_t most_arenas = s0.medium_arenas;
    live_block ring[KEEP];
    memset(ring, 0, sizeof ring);
    uint64_t x = 0x243f6a8885a308d3ull;
    for (unsigned i = 0; i < ROUNDS; i++) {
        live_block *b = &ring[i % KEEP];
        if (b->p != NULL) {
            check_contents(b->p, ENDS, b->seed, "the front of a medium aligned block");
            check_contents((unsigned char *)b->p + b->usable - ENDS, ENDS, b->seed + 1,
                           "the end of a medium aligned block");
            shard_free(b->p);
            b->p = NULL;
        }
        x = harness_mix64(x + i);
        size_t align = (size_t)4096 << (x % 9); /* 4 KB .. 1 MB */
        size_t size = 20 * KB + (size_t)(x >> 16) % (MB - 20 * KB + 1);
        unsigned char *p = shard_malloc_aligned(size, align);
        CHECKF(p != NULL && is_aligned(p, align) && shard_usable_size(p) >= size,
               "round %u: shard_malloc_aligned(%zu, %zu) = %p", i, size, align, (void *)p);
        if (p == NULL)
            continue;
        b->p = p;
        b->usable = shard_usable_size(p);
        b->seed = 0x10000 + 2 * (uint64_t)i;
        fill_range(p, 0, ENDS, b->seed);
        fill_range(p + b->usable - ENDS, 0, ENDS, b->seed + 1);
        if (i % 64 == 0) {
            shard_stats s = stats_now();
            if (s.medium_arenas > most_arenas)
                most_arenas = s.medium_arenas;
        }
        if (i % 1000 == 0)
            check_allocator("during the medium aligned loop");
    }
    for (unsigned i = 0; i < KEEP; i++)
        shard_free(ring[i].p);
    shard_stats s1 = stats_now();
    CHECKF(most_arenas <= s0.medium_arenas + ARENAS_MAX,
           "medium arenas: %zu at the start, up to %zu in a loop of %d aligned blocks, %d live at a time",
           s0.medium_arenas, most_arenas, ROUNDS, KEEP);
    CHECKF(s1.live_medium == s0.live_medium, "live_medium %zu, %zu at the start", s1.live_medium, s0.live_medium);
    check_end(start, "after the medium aligned loop");
}
