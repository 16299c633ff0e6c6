/* test_malloc.c - the C library's malloc family under its own names, as the drop-in build/libshardmm.so
 * exports them (port/malloc.c), in a program linked with it: malloc, free, calloc, realloc,
 * reallocarray, posix_memalign, aligned_alloc, memalign, valloc, pvalloc, malloc_usable_size.
 *
 * The rules, as this file reads them (include/shardmm.h, port/malloc.c): each name is shardmm's, with
 * glibc's semantics - calloc zeroes and refuses an overflowing product, realloc(p, 0) frees and returns
 * NULL, realloc(NULL, n) allocates, posix_memalign returns its error and sets *out only on success, the
 * others return NULL with errno ENOMEM on failure, and a successful call leaves errno alone. The C
 * library's own allocations (strdup, stdio, asprintf, qsort, threads) come from shardmm too, and any
 * thread may free any block.
 *
 * The program calls the malloc family through volatile pointers: the compiler knows what these names
 * mean and could otherwise drop a malloc/free pair, fold a test on its result or warn about a size it
 * sees is impossible. shard_usable_size and shard_get_stats, which the compiler knows nothing about,
 * observe the blocks.
 *
 * Linux only. Build: see build.ninja (build/test-malloc). Run: build/test-malloc [test names]
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardmm.h"
#include "dropin.h"

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define PAGE_BYTES (4 * KB)

static void *(*volatile c_malloc)(size_t) = malloc;
static void (*volatile c_free)(void *) = free;
static void *(*volatile c_calloc)(size_t, size_t) = calloc;
static void *(*volatile c_realloc)(void *, size_t) = realloc;
static void *(*volatile c_reallocarray)(void *, size_t, size_t) = reallocarray;
static int (*volatile c_posix_memalign)(void **, size_t, size_t) = posix_memalign;
static void *(*volatile c_aligned_alloc)(size_t, size_t) = aligned_alloc;
static void *(*volatile c_memalign)(size_t, size_t) = memalign;
static void *(*volatile c_valloc)(size_t) = valloc;
static void *(*volatile c_pvalloc)(size_t) = pvalloc;
static size_t (*volatile c_malloc_usable_size)(void *) = malloc_usable_size;

/* ---- observation ---- */

/* An error hook that counts: a pointer the C library got from anyone but shardmm would reach it. */
static int hook_calls;
static void counting_hook(void *arg, int error, void *ptr)
{
    (void)arg, (void)error, (void)ptr;
    __atomic_add_fetch(&hook_calls, 1, __ATOMIC_RELAXED);
}

/* Every test runs with the counting hook installed and checks at its end that nothing reached it and
 * that shard_check() is 0. */
static shard_error_fn hook_install(void)
{
    __atomic_store_n(&hook_calls, 0, __ATOMIC_RELAXED);
    return shard_set_error_hook(counting_hook, NULL);
}

static void hook_uninstall(shard_error_fn previous, const char *where)
{
    int calls = __atomic_load_n(&hook_calls, __ATOMIC_RELAXED);
    CHECKF(calls == 0, "%s: the error hook was called %d times", where, calls);
    shard_set_error_hook(previous, NULL);
    int problems = shard_check();
    CHECKF(problems == 0, "%s: shard_check() = %d", where, problems);
}

static size_t live_blocks(void)
{
    shard_stats s;
    shard_get_stats(&s);
    return s.live_small + s.live_medium + s.live_large;
}

static void check_contents(const void *p, size_t n, uint64_t seed, const char *what)
{
    if (!holds_pattern((const unsigned char *)p, n, seed))
        CHECK_PATTERN(p, n, seed, what);
}

static int is_aligned(const void *p, size_t align)
{
    return ((uintptr_t)p & (align - 1)) == 0;
}

static const size_t kinds[] = { 1, 100, 1000, 16384, 16385, 100000, MB, MB + 1, 5 * MB };
#define KINDS_COUNT (sizeof kinds / sizeof kinds[0])

/* ---- the names are shardmm's ---- */

/* malloc, calloc, realloc and the C library's own malloc resolve to build/libshardmm.so, and a malloc
 * makes a live block in shardmm's statistics that free takes away again. */
TEST(the_malloc_family_of_the_program_is_shardmm)
{
    static const dropin_name names[] = {
        { "malloc", (void *)malloc }, { "free", (void *)free }, { "calloc", (void *)calloc },
        { "realloc", (void *)realloc }, { "reallocarray", (void *)reallocarray },
        { "posix_memalign", (void *)posix_memalign }, { "aligned_alloc", (void *)aligned_alloc },
        { "memalign", (void *)memalign }, { "valloc", (void *)valloc }, { "pvalloc", (void *)pvalloc },
        { "malloc_usable_size", (void *)malloc_usable_size },
    };
    check_names_are_shardmms(names, sizeof names / sizeof names[0]);
    shard_error_fn previous = hook_install();
    for (size_t i = 0; i < KINDS_COUNT; i++) {
        size_t before = live_blocks();
        void *p = c_malloc(kinds[i]);
        CHECKF(p != NULL && live_blocks() == before + 1, "malloc(%zu) = %p: live blocks %zu -> %zu", kinds[i], p,
               before, live_blocks());
        CHECKF(shard_usable_size(p) >= kinds[i], "shard_usable_size(malloc(%zu)) = %zu", kinds[i],
               shard_usable_size(p));
        c_free(p);
        CHECKF(live_blocks() == before, "free: live blocks %zu, %zu before the malloc", live_blocks(), before);
        p = c_calloc(1, kinds[i]);
        CHECKF(p != NULL && live_blocks() == before + 1, "calloc(1, %zu): live blocks %zu -> %zu", kinds[i], before,
               live_blocks());
        p = c_realloc(p, kinds[i] + 1);
        CHECKF(p != NULL && live_blocks() == before + 1, "realloc: live blocks %zu -> %zu", before, live_blocks());
        c_free(p);
        CHECKF(live_blocks() == before, "free: live blocks %zu, %zu before the calloc", live_blocks(), before);
    }
    hook_uninstall(previous, "the names are shardmm's");
}

/* malloc_usable_size is shard_usable_size, for blocks of every kind and NULL. */
TEST(malloc_usable_size_is_shard_usable_size)
{
    shard_error_fn previous = hook_install();
    for (size_t i = 0; i < KINDS_COUNT; i++) {
        unsigned char *p = c_malloc(kinds[i]);
        CHECK(p != NULL);
        if (p == NULL)
            continue;
        size_t n = c_malloc_usable_size(p);
        CHECKF(n == shard_usable_size(p) && n >= kinds[i], "malloc_usable_size(malloc(%zu)) = %zu, shard_usable_size %zu",
               kinds[i], n, shard_usable_size(p));
        fill(p, n, 0x100 + i);
        check_contents(p, n, 0x100 + i, "a block written over its malloc_usable_size");
        c_free(p);
    }
    CHECK_EQ(c_malloc_usable_size(NULL), 0);
    hook_uninstall(previous, "malloc_usable_size");
}

/* ---- glibc's semantics ---- */

/* calloc zeroes memory that was written before: blocks of every kind allocated, filled, freed, then
 * calloc'd again (small and medium blocks reuse the freed room, large ones come from the cache). */
TEST(calloc_zeroes_dirty_memory_of_every_kind)
{
    enum { N = 16 };
    shard_error_fn previous = hook_install();
    for (size_t i = 0; i < KINDS_COUNT; i++) {
        size_t n = kinds[i];
        unsigned char *p[N];
        for (int j = 0; j < N; j++) {
            p[j] = c_malloc(n);
            CHECK(p[j] != NULL);
            if (p[j] != NULL)
                memset(p[j], 0xa5, c_malloc_usable_size(p[j]));
        }
        for (int j = N - 1; j >= 0; j--)
            c_free(p[j]);
        for (int j = 0; j < N; j++) {
            p[j] = c_calloc(n, 1);
            CHECK(p[j] != NULL);
            if (p[j] == NULL)
                continue;
            size_t bad = bytes_not_equal(p[j], n, 0);
            CHECKF(bad == n, "calloc(%zu, 1) = %p: byte %zu is not zero", n, (void *)p[j], bad);
        }
        for (int j = 0; j < N; j++)
            c_free(p[j]);
        /* as count * size the other way round */
        unsigned char *q = c_calloc(1, n);
        CHECK(q != NULL && bytes_not_equal(q, n, 0) == n);
        c_free(q);
    }
    hook_uninstall(previous, "calloc of dirty memory");
}

/* calloc whose product overflows, and sizes no allocation can satisfy (malloc, calloc, realloc), give
 * NULL with errno ENOMEM; realloc leaves its block as it was. */
TEST(impossible_sizes_give_null_with_errno_enomem)
{
    static const struct {
        size_t count, size;
    } overflow[] = {
        { SIZE_MAX, 2 }, { 2, SIZE_MAX }, { (size_t)1 << 32, (size_t)1 << 32 }, { SIZE_MAX / 3 + 1, 3 },
        { (SIZE_MAX >> 1) + 1, 2 },
    };
    static const size_t huge[] = { SIZE_MAX, SIZE_MAX - PAGE_BYTES, (size_t)1 << 62, (size_t)1 << 50 };
    shard_error_fn previous = hook_install();
    size_t before = live_blocks();
    for (size_t i = 0; i < sizeof overflow / sizeof overflow[0]; i++) {
        errno = 0;
        void *p = c_calloc(overflow[i].count, overflow[i].size);
        CHECKF(p == NULL && errno == ENOMEM, "calloc(%zu, %zu) = %p, errno %d", overflow[i].count, overflow[i].size,
               p, errno);
    }
    unsigned char *b = c_malloc(5000);
    CHECK(b != NULL);
    if (b == NULL)
        return;
    size_t usable = c_malloc_usable_size(b);
    fill(b, usable, 0x200);
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        errno = 0;
        void *p = c_malloc(huge[i]);
        CHECKF(p == NULL && errno == ENOMEM, "malloc(%zu) = %p, errno %d", huge[i], p, errno);
        errno = 0;
        p = c_calloc(1, huge[i]);
        CHECKF(p == NULL && errno == ENOMEM, "calloc(1, %zu) = %p, errno %d", huge[i], p, errno);
        errno = 0;
        p = c_calloc(huge[i] / 8, 8);
        CHECKF(p == NULL && errno == ENOMEM, "calloc(%zu, 8) = %p, errno %d", huge[i] / 8, p, errno);
        errno = 0;
        p = c_realloc(b, huge[i]);
        CHECKF(p == NULL && errno == ENOMEM, "realloc(p, %zu) = %p, errno %d", huge[i], p, errno);
    }
    CHECK_EQ(c_malloc_usable_size(b), usable);
    check_contents(b, usable, 0x200, "a block after realloc to impossible sizes");
    c_free(b);
    CHECKF(live_blocks() == before, "live blocks %zu, %zu at the start", live_blocks(), before);
    hook_uninstall(previous, "impossible sizes");
}

/* realloc(p, 0) frees p and returns NULL; realloc(NULL, n) is malloc(n); between them realloc keeps the
 * contents across every kind. */
TEST(realloc_to_zero_frees_and_realloc_of_null_allocates)
{
    shard_error_fn previous = hook_install();
    size_t start = live_blocks();
    for (size_t i = 0; i < KINDS_COUNT; i++) {
        unsigned char *p = c_realloc(NULL, kinds[i]);
        CHECKF(p != NULL && live_blocks() == start + 1, "realloc(NULL, %zu) = %p", kinds[i], (void *)p);
        if (p == NULL)
            continue;
        size_t usable = c_malloc_usable_size(p);
        CHECK(usable >= kinds[i]);
        fill(p, usable, 0x300 + i);
        size_t to = kinds[(i + 4) % KINDS_COUNT];
        unsigned char *q = c_realloc(p, to);
        CHECKF(q != NULL, "realloc(%zu -> %zu) = NULL", kinds[i], to);
        if (q != NULL) {
            check_contents(q, usable < to ? usable : to, 0x300 + i, "a block moved by realloc");
            p = q;
        }
        CHECK(c_realloc(p, 0) == NULL);
        CHECKF(live_blocks() == start, "realloc(p, 0) of a block of %zu: live blocks %zu, %zu at the start", to,
               live_blocks(), start);
    }
    hook_uninstall(previous, "realloc to 0 and of NULL");
}

/* reallocarray: an overflowing product gives NULL, errno ENOMEM, and the block as it was; otherwise it
 * resizes to count * size. */
TEST(reallocarray_overflow_gives_null_errno_enomem_and_keeps_the_block)
{
    shard_error_fn previous = hook_install();
    unsigned char *p = c_reallocarray(NULL, 100, 30);
    CHECK(p != NULL && c_malloc_usable_size(p) >= 3000);
    if (p == NULL)
        return;
    size_t usable = c_malloc_usable_size(p);
    fill(p, usable, 0x400);
    errno = 0;
    CHECK(c_reallocarray(p, SIZE_MAX / 2, 3) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(c_reallocarray(p, (size_t)1 << 32, (size_t)1 << 32) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(c_reallocarray(NULL, SIZE_MAX, SIZE_MAX) == NULL && errno == ENOMEM);
    CHECK_EQ(c_malloc_usable_size(p), usable);
    check_contents(p, usable, 0x400, "a block after reallocarray overflows");
    unsigned char *q = c_reallocarray(p, 1000, 100);
    CHECK(q != NULL && c_malloc_usable_size(q) >= 100000);
    if (q != NULL) {
        check_contents(q, usable, 0x400, "a block grown by reallocarray");
        p = q;
    }
    c_free(p);
    hook_uninstall(previous, "reallocarray");
}

/* posix_memalign: EINVAL for align 0, below sizeof(void *) or not a power of two (as glibc: any power of
 * two multiple of sizeof(void *) is valid), and ENOMEM for an impossible size or alignment - *out
 * untouched and errno unchanged on EINVAL; 0 and an aligned block otherwise. */
TEST(posix_memalign_errors_and_success)
{
    static const size_t bad[] = { 0, 1, 2, 4, 3, 12, 24, 100, 3 * MB, SIZE_MAX };
    shard_error_fn previous = hook_install();
    void *sentinel = &previous, *out;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        out = sentinel;
        errno = 1234;
        int rc = c_posix_memalign(&out, bad[i], 100);
        CHECKF(rc == EINVAL && out == sentinel && errno == 1234, "posix_memalign(%zu, 100) = %d, out %p, errno %d",
               bad[i], rc, out, errno);
    }
    out = sentinel;
    int rc = c_posix_memalign(&out, 64, SIZE_MAX - PAGE_BYTES);
    CHECKF(rc == ENOMEM && out == sentinel, "posix_memalign(64, SIZE_MAX - 4096) = %d, out %p", rc, out);
    rc = c_posix_memalign(&out, (size_t)1 << 63, 100);
    CHECKF(rc == ENOMEM && out == sentinel, "posix_memalign(2^63, 100) = %d, out %p", rc, out);
    rc = c_posix_memalign(&out, 8 * MB, 100);
    CHECKF(rc == 0 && out != sentinel && is_aligned(out, 8 * MB), "posix_memalign(8 MB, 100) = %d, out %p", rc, out);
    if (rc == 0) {
        fill(out, 100, 0x4100);
        check_contents(out, 100, 0x4100, "a block aligned to 8 MB");
        c_free(out);
        out = sentinel;
    }
    for (size_t align = sizeof(void *); align <= 2 * MB; align <<= 1) {
        for (size_t i = 0; i < KINDS_COUNT; i++) {
            out = sentinel;
            errno = 1234;
            rc = c_posix_memalign(&out, align, kinds[i]);
            CHECKF(rc == 0 && out != sentinel && is_aligned(out, align) && errno == 1234,
                   "posix_memalign(%zu, %zu) = %d, out %p, errno %d", align, kinds[i], rc, out, errno);
            if (rc != 0 || out == sentinel)
                continue;
            size_t usable = c_malloc_usable_size(out);
            CHECK(usable >= kinds[i]);
            fill_range(out, 0, usable, 0x500 + align + i);
            check_contents(out, usable, 0x500 + align + i, "a posix_memalign block");
            c_free(out);
        }
    }
    hook_uninstall(previous, "posix_memalign");
}

/* aligned_alloc and memalign round the alignment up (below 16 to 16, others to a power of two);
 * valloc is page-aligned; pvalloc gives whole pages (0 one page); impossible sizes give NULL with errno
 * ENOMEM. */
TEST(aligned_alloc_memalign_valloc_pvalloc_alignment_and_errno)
{
    static const struct {
        size_t asked, given;
    } rounding[] = { { 1, 16 }, { 8, 16 }, { 24, 32 }, { 64, 64 }, { 100, 128 }, { 4096, 4096 }, { 5000, 8192 },
                     { 65536, 65536 }, { MB + 1, 2 * MB } };
    static const size_t sizes[] = { 0, 1, 100, 5000, 16384, 20000, MB, 3 * MB };
    shard_error_fn previous = hook_install();
    for (int fn = 0; fn < 2; fn++) {
        const char *name = fn ? "memalign" : "aligned_alloc";
        for (size_t r = 0; r < sizeof rounding / sizeof rounding[0]; r++) {
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
                errno = 1234;
                void *p = fn ? c_memalign(rounding[r].asked, sizes[s]) : c_aligned_alloc(rounding[r].asked, sizes[s]);
                CHECKF(p != NULL && is_aligned(p, rounding[r].given) && c_malloc_usable_size(p) >= sizes[s] &&
                           errno == 1234,
                       "%s(%zu, %zu) = %p (expected a multiple of %zu), errno %d", name, rounding[r].asked, sizes[s], p,
                       rounding[r].given, errno);
                if (p != NULL)
                    memset(p, 0x5a, c_malloc_usable_size(p));
                c_free(p);
            }
        }
        errno = 0;
        void *p = fn ? c_memalign(64, SIZE_MAX - PAGE_BYTES) : c_aligned_alloc(64, SIZE_MAX - PAGE_BYTES);
        CHECKF(p == NULL && errno == ENOMEM, "%s(64, SIZE_MAX - 4096) = %p, errno %d", name, p, errno);
    }
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s], pages = n == 0 ? PAGE_BYTES : (n + PAGE_BYTES - 1) / PAGE_BYTES * PAGE_BYTES;
        errno = 1234;
        void *p = c_valloc(n);
        CHECKF(p != NULL && is_aligned(p, PAGE_BYTES) && c_malloc_usable_size(p) >= n && errno == 1234,
               "valloc(%zu) = %p, errno %d", n, p, errno);
        if (p != NULL)
            memset(p, 0x5a, c_malloc_usable_size(p));
        c_free(p);
        p = c_pvalloc(n);
        CHECKF(p != NULL && is_aligned(p, PAGE_BYTES) && c_malloc_usable_size(p) >= pages && errno == 1234,
               "pvalloc(%zu) = %p, usable size %zu (expected %zu at least), errno %d", n, p,
               p ? c_malloc_usable_size(p) : 0, pages, errno);
        if (p != NULL)
            memset(p, 0x5a, c_malloc_usable_size(p));
        c_free(p);
    }
    errno = 0;
    CHECK(c_valloc(SIZE_MAX) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(c_pvalloc(SIZE_MAX) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(c_pvalloc(SIZE_MAX - PAGE_BYTES) == NULL && errno == ENOMEM);
    hook_uninstall(previous, "aligned_alloc, memalign, valloc, pvalloc");
}

/* A successful call of the family leaves errno as it was, for blocks of every kind. */
TEST(successful_calls_leave_errno_alone)
{
    shard_error_fn previous = hook_install();
    for (size_t i = 0; i < KINDS_COUNT; i++) {
        size_t n = kinds[i];
        errno = 4321;
        void *a = c_malloc(n), *b = c_calloc(n, 1), *c = c_realloc(NULL, n);
        CHECKF(a && b && c && errno == 4321, "malloc, calloc, realloc(NULL) of %zu: errno %d", n, errno);
        c = c_realloc(c, 2 * n);
        a = c_realloc(a, n / 2 + 1);
        b = c_reallocarray(b, n, 2);
        CHECKF(a && b && c && errno == 4321, "realloc and reallocarray of %zu: errno %d", n, errno);
        void *d = NULL;
        int rc = c_posix_memalign(&d, 4096, n);
        void *e = c_memalign(65536, n), *f = c_valloc(n);
        CHECKF(rc == 0 && d && e && f && errno == 4321, "aligned allocations of %zu: errno %d", n, errno);
        (void)c_malloc_usable_size(a);
        c_free(a);
        c_free(b);
        c_free(c);
        c_free(d);
        c_free(e);
        c_free(f);
        c_free(NULL);
        CHECKF(errno == 4321, "free of blocks of %zu: errno %d", n, errno);
    }
    hook_uninstall(previous, "errno after successful calls");
}

/* ---- the C library allocates with shardmm ---- */

/* strdup's copy, asprintf's string, stdio's FILE and buffers are shardmm's blocks: their usable size
 * needs no hook, fopen makes live blocks that fclose frees, and a long string goes through printf. */
TEST(the_c_library_allocates_from_shardmm)
{
    enum { LONG = 200000 };
    shard_error_fn previous = hook_install();
    char *s = strdup("a string the C library copies");
    CHECK(s != NULL && shard_usable_size(s) >= strlen("a string the C library copies") + 1);
    free(s);

    char *text = malloc(LONG + 1);
    CHECK(text != NULL);
    if (text == NULL)
        return;
    for (size_t i = 0; i < LONG; i++)
        text[i] = (char)('a' + i % 26);
    text[LONG] = 0;
    char *copy = strdup(text);
    CHECK(copy != NULL && strcmp(copy, text) == 0 && shard_usable_size(copy) > LONG);
    free(copy);

    char *formatted = NULL;
    int n = asprintf(&formatted, "[%s|%d]", text, 42);
    CHECKF(n == LONG + 5 && formatted != NULL && shard_usable_size(formatted) > (size_t)n, "asprintf: %d", n);
    if (formatted != NULL) {
        CHECK(formatted[0] == '[' && memcmp(formatted + 1, text, LONG) == 0 && strcmp(formatted + 1 + LONG, "|42]") == 0);
        free(formatted);
    }

    size_t before = live_blocks();
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (f != NULL) {
        /* a long string and a wide field, which make printf take working memory */
        int written = fprintf(f, "%s%*d", text, 100000, 7);
        CHECKF(written == LONG + 100000, "fprintf of a long string: %d", written);
        CHECKF(live_blocks() > before, "live blocks %zu with a FILE open, %zu before", live_blocks(), before);
        rewind(f);
        char *back = malloc(LONG + 100001);
        CHECK(back != NULL);
        if (back != NULL) {
            size_t got = fread(back, 1, LONG + 100000, f);
            CHECK(got == LONG + 100000 && memcmp(back, text, LONG) == 0 && back[LONG + 99999] == '7' &&
                  back[LONG] == ' ');
            free(back);
        }
        CHECK(fclose(f) == 0);
    }
    CHECKF(live_blocks() == before, "live blocks %zu after fclose, %zu before fopen", live_blocks(), before);

    FILE *null = fopen("/dev/null", "w");
    CHECK(null != NULL);
    if (null != NULL) {
        CHECK(fprintf(null, "%s %.*s %200000s", text, 5000, text, "x") > LONG);
        fclose(null);
    }
    CHECKF(live_blocks() == before, "live blocks %zu after printing to /dev/null, %zu before", live_blocks(), before);
    free(text);
    hook_uninstall(previous, "the C library's allocations");
}

static int compare_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* qsort of an array large enough for glibc's merge sort to take a buffer with malloc. */
TEST(qsort_sorts_with_a_buffer_from_shardmm)
{
    enum { N = 300000 };
    shard_error_fn previous = hook_install();
    int *a = malloc(N * sizeof *a);
    CHECK(a != NULL);
    if (a == NULL)
        return;
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = harness_mix64(x + (uint64_t)i);
        a[i] = (int)(x % 1000003);
    }
    qsort(a, N, sizeof *a, compare_int);
    int sorted = 1;
    for (int i = 1; i < N; i++)
        sorted &= a[i - 1] <= a[i];
    CHECK(sorted);
    free(a);
    hook_uninstall(previous, "qsort");
}

/* ---- threads ---- */

enum { HANDED = 24 };
typedef struct {
    unsigned char *p[HANDED];
    size_t n[HANDED];
    uint64_t seed;
} handed;

static void *allocate_handed(void *arg)
{
    handed *h = arg;
    for (int i = 0; i < HANDED; i++) {
        h->n[i] = kinds[i % KINDS_COUNT] + (size_t)i;
        h->p[i] = i % 3 == 0 ? c_malloc(h->n[i]) : i % 3 == 1 ? c_calloc(h->n[i], 1) : c_memalign(256, h->n[i]);
        CHECK(h->p[i] != NULL);
        if (h->p[i] != NULL)
            fill(h->p[i], h->n[i], h->seed + (uint64_t)i);
    }
    return NULL;
}

static void *check_and_free_handed(void *arg)
{
    handed *h = arg;
    for (int i = 0; i < HANDED; i++) {
        if (h->p[i] == NULL)
            continue;
        check_contents(h->p[i], h->n[i], h->seed + (uint64_t)i, "a block another thread allocated");
        c_free(h->p[i]);
        h->p[i] = NULL;
    }
    return NULL;
}

static void *nothing(void *arg)
{
    return arg;
}

/* Blocks made with malloc, calloc and memalign by a pthread and freed by the main thread, and the other
 * way round: contents intact; nothing stays live. */
TEST(blocks_change_threads_with_their_contents)
{
    static handed h;
    shard_error_fn previous = hook_install();
    /* glibc keeps what its first thread allocated (the stack it caches holds a block or two): a thread
     * before the count. */
    run_thread(nothing, NULL);
    size_t start = live_blocks();
    h.seed = 0x600;
    run_thread(allocate_handed, &h);
    check_and_free_handed(&h);
    h.seed = 0x700;
    allocate_handed(&h);
    run_thread(check_and_free_handed, &h);
    shard_collect(); /* take in what went back to heaps that other threads own or left */
    CHECKF(live_blocks() == start, "live blocks %zu, %zu at the start", live_blocks(), start);
    hook_uninstall(previous, "blocks changing threads");
}
