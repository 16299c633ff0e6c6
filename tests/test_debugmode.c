/* test_debugmode.c - the full-debug build (SHARD_FULL_DEBUG=1, src/debugmode.c) against the bugs it is
 * for, and in ordinary use.
 *
 * The rules, as this file reads them (README.md, src/debugmode.c):
 * - each planted bug reaches the error hook once, with its kind (include/shardmm.h: enum shard_error)
 *   and the program's pointer, and the operation does nothing more (a damaged block is never handed out,
 *   a bad pointer's real block stays live and intact);
 * - before the hook, a report on stderr names the kind, the block and its size, where it was allocated,
 *   where it was freed (for a freed block) and the call that found it: return addresses, inside the
 *   functions of this file that made those calls (plant_*). On Linux (linked with -rdynamic) the report
 *   also names those functions; on Windows the module and the offset;
 * - ordinary use: realloc keeps the contents, calloc zeroes, aligned blocks are aligned,
 *   shard_usable_size is the size asked for, the quarantine keeps memory bounded, threads work, and
 *   shard_check finds nothing where there is nothing.
 * Every planted bug's check fails if its detection is removed: the hook's count is checked, and the
 * sites are checked against the planting functions' addresses.
 *
 * The report is captured by pointing stderr (the descriptor on Linux, the standard handle on Windows,
 * which the port looks up at each write) at a temporary file around the planted bug.
 *
 * Build: see build.ninja (build/debug/full/test-debugmode, build/win64/debug/full/test-debugmode.exe).
 * Run:   build/debug/full/test-debugmode [test names]
 */
#define HARNESS_MAIN
#include "harness.h"
#define PLATFORM_CHILD
#include "platform.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifndef _WIN32
#include <fcntl.h>
#endif

#include "shardmm.h"

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define QUARANTINE_DEFAULT (16 * MB)

/* ---- the error hook's calls ---- */

#define MAX_CALLS 64
static struct {
    mutex_t lock;
    int count;
    int error[MAX_CALLS];
    void *ptr[MAX_CALLS];
} calls = {MUTEX_INIT, 0, {0}, {0}};

static void record(void *arg, int error, void *ptr)
{
    (void)arg;
    mutex_lock(&calls.lock);
    if (calls.count < MAX_CALLS) {
        calls.error[calls.count] = error;
        calls.ptr[calls.count] = ptr;
    }
    calls.count++;
    mutex_unlock(&calls.lock);
}

static void calls_reset(void)
{
    shard_set_error_hook(record, NULL);
    mutex_lock(&calls.lock);
    calls.count = 0;
    mutex_unlock(&calls.lock);
}

/* Exactly one call since calls_reset, of that kind for that pointer. */
#define CHECK_ONE_CALL(kind, p)                                                                          \
    do {                                                                                                 \
        CHECKF(calls.count == 1, "%d calls of the error hook, expected 1", calls.count);                \
        if (calls.count >= 1) {                                                                          \
            CHECK_EQ(calls.error[0], (kind));                                                            \
            CHECK_EQ(calls.ptr[0], (p));                                                                 \
        }                                                                                                \
    } while (0)

/* ---- capturing stderr ---- */

static char report[16384];

#ifdef _WIN32
static HANDLE capture_file, saved_stderr;

static void capture_begin(void)
{
    char dir[MAX_PATH], path[MAX_PATH];
    GetTempPathA(sizeof dir, dir);
    GetTempFileNameA(dir, "sdm", 0, path);
    capture_file = CreateFileA(path, GENERIC_READ | GENERIC_WRITE, FILE_SHARE_READ | FILE_SHARE_WRITE, NULL,
                               CREATE_ALWAYS, FILE_ATTRIBUTE_TEMPORARY | FILE_FLAG_DELETE_ON_CLOSE, NULL);
    fflush(stderr);
    saved_stderr = GetStdHandle(STD_ERROR_HANDLE);
    SetStdHandle(STD_ERROR_HANDLE, capture_file);
}

static void capture_end(void)
{
    DWORD got = 0;
    SetStdHandle(STD_ERROR_HANDLE, saved_stderr);
    SetFilePointer(capture_file, 0, NULL, FILE_BEGIN);
    if (!ReadFile(capture_file, report, sizeof report - 1, &got, NULL))
        got = 0;
    report[got] = 0;
    CloseHandle(capture_file);
}
#else
static int saved_stderr, capture_fd;

static void capture_begin(void)
{
    FILE *f = tmpfile();
    capture_fd = dup(fileno(f));
    fclose(f);
    fflush(stderr);
    saved_stderr = dup(2);
    dup2(capture_fd, 2);
}

static void capture_end(void)
{
    dup2(saved_stderr, 2);
    close(saved_stderr);
    lseek(capture_fd, 0, SEEK_SET);
    ssize_t got = read(capture_fd, report, sizeof report - 1);
    report[got > 0 ? got : 0] = 0;
    close(capture_fd);
}
#endif

/* ---- the planting functions: the sites the reports must name ---- */

/* Each calls shardmm once and then uses the result, so that the call is not a tail call (its return
 * address is inside the function). */
#define KEEP(x) __asm__ volatile("" : : "r"(x) : "memory")

__attribute__((noinline)) void *plant_alloc(size_t n)
{
    void *p = shard_malloc(n);
    KEEP(p);
    return p;
}

__attribute__((noinline)) void plant_free(void *p)
{
    shard_free(p);
    KEEP(p);
}

__attribute__((noinline)) void plant_free_again(void *p)
{
    shard_free(p);
    KEEP(p);
}

__attribute__((noinline)) void *plant_realloc(void *p, size_t n)
{
    void *q = shard_realloc(p, n);
    KEEP(q);
    return q;
}

__attribute__((noinline)) void *plant_alloc_aligned(size_t n, size_t align)
{
    void *p = shard_malloc_aligned(n, align);
    KEEP(p);
    return p;
}

typedef struct site_fn {
    const char *name;
    uintptr_t start;
} site_fn;

static site_fn sites[] = {
    {"plant_alloc", 0}, {"plant_free", 0}, {"plant_free_again", 0}, {"plant_realloc", 0},
    {"plant_alloc_aligned", 0},
};
#define SITES (sizeof sites / sizeof sites[0])

static void sites_init(void)
{
    sites[0].start = (uintptr_t)plant_alloc;
    sites[1].start = (uintptr_t)plant_free;
    sites[2].start = (uintptr_t)plant_free_again;
    sites[3].start = (uintptr_t)plant_realloc;
    sites[4].start = (uintptr_t)plant_alloc_aligned;
}

/* The planting function that holds address a (below the next one and within 256 bytes), or NULL. */
static const char *site_name(uintptr_t a)
{
    if (sites[0].start == 0)
        sites_init();
    for (size_t i = 0; i < SITES; i++) {
        uintptr_t end = sites[i].start + 256;
        for (size_t k = 0; k < SITES; k++)
            if (sites[k].start > sites[i].start && sites[k].start < end)
                end = sites[k].start;
        if (a > sites[i].start && a < end)
            return sites[i].name;
    }
    return NULL;
}

/* The address after `label` (e.g. "allocated at ") in the report, 0 if absent. */
static uintptr_t report_address(const char *label)
{
    const char *at = strstr(report, label);
    return at != NULL ? (uintptr_t)strtoull(at + strlen(label), NULL, 16) : 0;
}

/* The report names the site after `label` as the planting function `fn` (fn NULL: no such line). */
static void check_site(const char *label, const char *fn)
{
    uintptr_t a = report_address(label);
    if (fn == NULL) {
        CHECKF(a == 0, "the report has \"%s\" where none was expected:\n%s", label, report);
        return;
    }
    const char *found = site_name(a);
    CHECKF(found != NULL && strcmp(found, fn) == 0, "\"%s\" 0x%llx is in %s, expected %s; the report:\n%s", label,
           (unsigned long long)a, found ? found : "no planting function", fn, report);
#ifdef _WIN32
    char module[64];
    snprintf(module, sizeof module, "test-debugmode.exe+0x");
    CHECKF(strstr(report, module) != NULL, "the report does not name the module:\n%s", report);
#else
    char name[80];
    snprintf(name, sizeof name, "(%s+0x", fn);
    CHECKF(strstr(report, name) != NULL, "the report does not name %s:\n%s", fn, report);
#endif
}

static void check_report_says(const char *text)
{
    CHECKF(strstr(report, text) != NULL, "the report does not say \"%s\":\n%s", text, report);
}

/* The report's block address and size: "... the block at 0x... (N bytes)". */
static void check_report_block(const void *p, size_t size)
{
    char text[80];
    snprintf(text, sizeof text, "0x%llx (%zu bytes)", (unsigned long long)(uintptr_t)p, size);
    check_report_says(text);
}

/* Blocks the tests damaged and left live: the debug build keeps them out of use, and shard_check reports
 * them every time. */
static int left_damaged;

/* shard_check's count, its report captured. */
static int check_quiet(void)
{
    capture_begin();
    int n = shard_check();
    capture_end();
    return n;
}

/* Every block in the quarantine leaves it: more bytes than it holds are freed after them. */
static void flush_quarantine(void)
{
    for (size_t i = 0; i < QUARANTINE_DEFAULT / MB + 2; i++)
        shard_free(shard_malloc(MB - 256));
}

/* ---- planted bugs ---- */

TEST(double_free_of_a_small_block_between_live_neighbours)
{
    calls_reset();
    unsigned char *a = plant_alloc(40), *b = plant_alloc(40), *c = plant_alloc(40);
    fill(a, 40, 1);
    fill(c, 40, 3);
    plant_free(b);
    capture_begin();
    plant_free_again(b);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_DOUBLE_FREE, b);
    check_report_says("double free");
    check_report_block(b, 40);
    check_site("allocated at ", "plant_alloc");
    check_site("freed at ", "plant_free");
    check_site("found at ", "plant_free_again");
    CHECK_PATTERN(a, 40, 1, "the block before");
    CHECK_PATTERN(c, 40, 3, "the block after");
    calls_reset();
    shard_free(a);
    shard_free(c);
    CHECK_EQ(check_quiet(), left_damaged);
    CHECK_EQ(calls.count, 0);
}

TEST(double_free_a_b_a)
{
    calls_reset();
    void *a = plant_alloc(24), *b = plant_alloc(24);
    plant_free(a);
    plant_free(b);
    capture_begin();
    plant_free_again(a);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_DOUBLE_FREE, a);
    check_report_block(a, 24);
    check_site("allocated at ", "plant_alloc");
    check_site("freed at ", "plant_free");
    check_site("found at ", "plant_free_again");
    /* The allocator goes on: neither block is handed out twice. */
    void *x = shard_malloc(24), *y = shard_malloc(24);
    CHECK(x != y);
    shard_free(x);
    shard_free(y);
    CHECK_EQ(calls.count, 1);
}

static void *free_again_thread(void *p)
{
    plant_free_again(p);
    return NULL;
}

TEST(double_free_from_a_second_thread)
{
    calls_reset();
    void *p = plant_alloc(100);
    plant_free(p);
    thread_t t;
    capture_begin();
    CHECK(thread_start(&t, free_again_thread, p) == 0);
    thread_join(t);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_DOUBLE_FREE, p);
    check_report_block(p, 100);
    check_site("allocated at ", "plant_alloc");
    check_site("freed at ", "plant_free");
    check_site("found at ", "plant_free_again");
}

/* A write after free is found by shard_check (report only, it returns the count) and, through the hook,
 * when the block leaves the quarantine. */
static void check_write_after_free(unsigned char *p, size_t size, size_t at, unsigned char value)
{
    capture_begin();
    int problems = shard_check();
    capture_end();
    CHECK(problems >= 1);
    check_report_says("write after free");
    check_report_block(p, size);
    char text[64];
    snprintf(text, sizeof text, ": byte %zu is 0x%02x", at, value);
    check_report_says(text);
    check_site("allocated at ", "plant_alloc");
    check_site("freed at ", "plant_free");
    CHECK_EQ(calls.count, 0); /* shard_check reports; the hook is for operations */
    capture_begin();
    flush_quarantine();
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_WRITE_AFTER_FREE, p);
    check_report_says("write after free");
    check_report_block(p, size);
    check_site("allocated at ", "plant_alloc");
    check_site("freed at ", "plant_free");
    calls_reset();
    CHECK_EQ(check_quiet(), left_damaged); /* the damaged block left the quarantine, kept out of use */
}

TEST(use_after_free_write)
{
    flush_quarantine();
    calls_reset();
    struct node { void *next; long value; } *n = plant_alloc(sizeof *n);
    n->value = 5;
    plant_free(n);
    n->value = 7; /* the bug: through a stale pointer */
    check_write_after_free((unsigned char *)n, sizeof *n, 8, 7);
}

TEST(garbage_write_into_a_freed_medium_block)
{
    flush_quarantine();
    calls_reset();
    unsigned char *p = plant_alloc(100 * KB);
    plant_free(p);
    memset(p + 5000, 0x41, 300);
    check_write_after_free(p, 100 * KB, 5000, 0x41);
}

TEST(overflow_of_16_bytes_then_free)
{
    calls_reset();
    unsigned char *p = plant_alloc(40);
    memset(p, 1, 40);
    memset(p + 40, 0x41, 16); /* the bug */
    capture_begin();
    plant_free(p);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_OVERFLOW, p);
    left_damaged++;
    check_report_says("write outside the block");
    check_report_block(p, 40);
    check_report_says(": trailer byte 0 is 0x41");
    check_site("allocated at ", "plant_alloc");
    check_site("freed at ", NULL);
    check_site("found at ", "plant_free");
    /* Left alone: the same block is reported again by shard_check, never handed out. */
    CHECK_EQ(check_quiet(), left_damaged);
    check_report_block(p, 40);
}

TEST(write_before_the_block_then_free)
{
    calls_reset();
    unsigned char *p = plant_alloc(64);
    p[-1] = 0; /* the bug */
    capture_begin();
    plant_free(p);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_OVERFLOW, p);
    left_damaged++;
    check_report_says("write outside the block");
    check_site("found at ", "plant_free");
}

TEST(realloc_of_a_freed_block)
{
    calls_reset();
    void *p = plant_alloc(32);
    plant_free(p);
    capture_begin();
    void *q = plant_realloc(p, 100);
    capture_end();
    CHECK(q == NULL);
    CHECK_ONE_CALL(SHARD_ERROR_DOUBLE_FREE, p);
    check_report_block(p, 32);
    check_site("allocated at ", "plant_alloc");
    check_site("freed at ", "plant_free");
    check_site("found at ", "plant_realloc");
}

TEST(free_of_p_plus_8)
{
    calls_reset();
    unsigned char *p = plant_alloc(40);
    fill(p, 40, 8);
    capture_begin();
    plant_free(p + 8);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_INVALID_FREE, p + 8);
    check_report_says("not a block of ours, given to free:");
    check_site("found at ", "plant_free");
    CHECK_PATTERN(p, 40, 8, "the real block");
    CHECK_EQ(shard_usable_size(p), 40);
    calls_reset();
    shard_free(p); /* still live, and freed without complaint */
    CHECK_EQ(calls.count, 0);
}

TEST(free_of_p_minus_16_of_a_medium_block)
{
    calls_reset();
    unsigned char *p = plant_alloc(64 * KB);
    fill(p, 64 * KB, 16);
    capture_begin();
    plant_free(p - 16);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_INVALID_FREE, p - 16);
    check_site("found at ", "plant_free");
    CHECK_PATTERN(p, 64 * KB, 16, "the real block");
    calls_reset();
    shard_free(p);
    CHECK_EQ(calls.count, 0);
    CHECK_EQ(check_quiet(), left_damaged);
}

TEST(free_of_garbage_and_size_query_of_a_freed_block)
{
    calls_reset();
    static long not_ours[8];
    capture_begin();
    shard_free(&not_ours[2]);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_INVALID_FREE, &not_ours[2]);
    calls_reset();
    void *p = plant_alloc(10);
    plant_free(p);
    capture_begin();
    CHECK_EQ(shard_usable_size(p), 0);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_INVALID_SIZE_QUERY, p);
}

TEST(overflow_of_an_aligned_block_names_its_site)
{
    calls_reset();
    unsigned char *p = plant_alloc_aligned(300, 4096);
    CHECK_EQ((uintptr_t)p % 4096, 0);
    p[300] = 0; /* the bug */
    capture_begin();
    plant_free(p);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_OVERFLOW, p);
    left_damaged++;
    check_report_block(p, 300);
    check_site("allocated at ", "plant_alloc_aligned");
}

/* ---- ordinary use ---- */

TEST(usable_size_is_the_size_asked_and_new_blocks_hold_the_pattern)
{
    calls_reset();
    size_t sizes[] = {0, 1, 15, 16, 17, 100, 4000, 20000, 300000, 3 * MB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = shard_malloc(sizes[i]);
        CHECK(p != NULL && (uintptr_t)p % 16 == 0);
        CHECK_EQ(shard_usable_size(p), sizes[i]);
        CHECK_EQ(bytes_not_equal(p, sizes[i], 0xA5), sizes[i]);
        shard_free(p);
        CHECK_EQ(bytes_not_equal(p, sizes[i], 0xDD), sizes[i]); /* in the quarantine, filled */
    }
    CHECK_EQ(calls.count, 0);
}

TEST(realloc_keeps_the_contents)
{
    calls_reset();
    size_t sizes[] = {24, 3000, 200000, 2 * MB + 5, 100, 1};
    unsigned char *p = shard_malloc(10);
    fill(p, 10, 77);
    size_t have = 10;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *q = shard_realloc(p, sizes[i]);
        CHECK(q != NULL && q != p); /* always moves */
        size_t kept = have < sizes[i] ? have : sizes[i];
        CHECK_PATTERN(q, kept, 77, "realloc");
        fill(q, sizes[i], 77);
        p = q;
        have = sizes[i];
    }
    CHECK(shard_realloc(p, 0) == NULL);
    CHECK_EQ(calls.count, 0);
    CHECK_EQ(check_quiet(), left_damaged);
}

TEST(calloc_zeroes)
{
    calls_reset();
    for (size_t n = 1; n <= 300000; n = n * 3 + 1) {
        unsigned char *p = shard_calloc(n, 3);
        CHECK(p != NULL);
        CHECK_EQ(bytes_not_equal(p, n * 3, 0), n * 3);
        CHECK_EQ(shard_usable_size(p), n * 3);
        shard_free(p);
    }
    CHECK(shard_calloc(SIZE_MAX / 2, 3) == NULL);
    CHECK_EQ(calls.count, 0);
}

TEST(aligned_blocks_are_aligned)
{
    calls_reset();
    for (size_t align = 1; align <= 2 * MB; align <<= 1) {
        size_t sizes[] = {1, 100, 20000};
        for (size_t i = 0; i < 3; i++) {
            unsigned char *p = shard_malloc_aligned(sizes[i], align);
            CHECK(p != NULL && (uintptr_t)p % align == 0 && (uintptr_t)p % 16 == 0);
            CHECK_EQ(shard_usable_size(p), sizes[i]);
            fill(p, sizes[i], align);
            unsigned char *q = shard_realloc_aligned(p, sizes[i] * 2, align);
            CHECK(q != NULL && (uintptr_t)q % align == 0);
            CHECK_PATTERN(q, sizes[i], align, "realloc_aligned");
            shard_free(q);
        }
    }
    void *p = NULL;
    CHECK_EQ(shard_posix_memalign(&p, 256, 1000), 0);
    CHECK(p != NULL && (uintptr_t)p % 256 == 0);
    shard_free(p);
    CHECK_EQ(shard_posix_memalign(&p, 24, 1000), 22);
    p = shard_memalign(100, 50); /* rounded up to 128 */
    CHECK(p != NULL && (uintptr_t)p % 128 == 0);
    shard_free(p);
    p = shard_aligned_alloc(64, 64);
    CHECK(p != NULL && (uintptr_t)p % 64 == 0);
    shard_free(p);
    p = shard_valloc(10);
    CHECK(p != NULL && (uintptr_t)p % 4096 == 0);
    shard_free(p);
    p = shard_pvalloc(5000);
    CHECK(p != NULL && (uintptr_t)p % 4096 == 0 && shard_usable_size(p) == 8192);
    shard_free(p);
    CHECK(shard_malloc_aligned(10, 48) == NULL);
    CHECK_EQ(calls.count, 0);
    CHECK_EQ(check_quiet(), left_damaged);
}

TEST(quarantine_keeps_memory_bounded)
{
    calls_reset();
    flush_quarantine();
    shard_collect();
    shard_stats s;
    size_t peak = 0;
    for (int i = 0; i < 2000; i++) { /* 128 MB freed in all */
        void *p = shard_malloc(64 * KB);
        CHECK(p != NULL);
        shard_free(p);
        if (i % 100 == 99) {
            shard_get_stats(&s);
            if (s.committed > peak)
                peak = s.committed;
        }
    }
    CHECKF(peak < QUARANTINE_DEFAULT + 24 * MB, "committed up to %zu bytes", peak);
    CHECK_EQ(calls.count, 0);
}

/* A freed block that waits in the quarantine is not a live block of the program's: shard_get_stats leaves
 * it out of the live counts and bytes of its kind, as it does the blocks that left the quarantine. */
TEST(statistics_leave_out_the_quarantined_blocks)
{
    calls_reset();
    flush_quarantine();
    shard_stats before, live, after;
    shard_get_stats(&before);
    void *s = shard_malloc(100), *m = shard_malloc(100 * KB), *l = shard_malloc(3 * MB);
    CHECK(s != NULL && m != NULL && l != NULL);
    shard_get_stats(&live);
    CHECK_EQ(live.live_small, before.live_small + 1);
    CHECK_EQ(live.live_medium, before.live_medium + 1);
    CHECK_EQ(live.live_large, before.live_large + 1);
    shard_free(s);
    shard_free(m);
    shard_free(l);
    shard_get_stats(&after);
    CHECKF(after.live_small == before.live_small && after.live_small_bytes == before.live_small_bytes,
           "small: %zu blocks, %zu bytes after the frees; %zu, %zu before", after.live_small, after.live_small_bytes,
           before.live_small, before.live_small_bytes);
    CHECKF(after.live_medium == before.live_medium && after.live_medium_bytes == before.live_medium_bytes,
           "medium: %zu blocks, %zu bytes after the frees; %zu, %zu before", after.live_medium,
           after.live_medium_bytes, before.live_medium, before.live_medium_bytes);
    CHECKF(after.live_large == before.live_large && after.live_large_bytes == before.live_large_bytes,
           "large: %zu blocks, %zu bytes after the frees; %zu, %zu before", after.live_large, after.live_large_bytes,
           before.live_large, before.live_large_bytes);
    flush_quarantine();
    shard_get_stats(&after);
    CHECK_EQ(after.live_medium, before.live_medium);
    CHECK_EQ(after.live_large, before.live_large);
    CHECK_EQ(calls.count, 0);
}

TEST(leak_report_names_the_allocation_site)
{
    calls_reset();
    flush_quarantine();
    unsigned char *p = plant_alloc(333);
    memcpy(p, "leaked by plant_alloc", 21);
    capture_begin();
    size_t n = shard_report_leaks(NULL, NULL);
    capture_end();
    CHECK(n >= 1);
    check_report_says("leaked by plant_alloc");
    check_site("allocated at ", "plant_alloc");
    shard_free(p);
    CHECK_EQ(calls.count, 0);
}

typedef struct seen {
    void *p;
    size_t size;
    int hits;
} seen;

static int visit_one(void *arg, void *block, size_t usable, int kind)
{
    seen *s = arg;
    (void)kind;
    if (block == s->p) {
        s->hits++;
        s->size = usable;
    }
    return 0;
}

TEST(visit_gives_the_programs_blocks_without_the_quarantined_ones)
{
    calls_reset();
    void *p = shard_malloc(777), *q = shard_malloc(50);
    shard_free(q);
    seen s = {p, 0, 0};
    shard_visit(SHARD_VISIT_ALL, visit_one, &s);
    CHECK_EQ(s.hits, 1);
    CHECK_EQ(s.size, 777);
    seen t = {q, 0, 0};
    shard_visit(SHARD_VISIT_ALL, visit_one, &t);
    CHECK_EQ(t.hits, 0);
    shard_free(p);
}

TEST(created_heaps_are_checked_too)
{
    calls_reset();
    shard_heap *h = shard_heap_create(NULL);
    CHECK(h != NULL);
    unsigned char *p = shard_heap_malloc(h, 50);
    unsigned char *q = shard_heap_calloc(h, 10, 10);
    CHECK(p != NULL && q != NULL);
    CHECK_EQ(bytes_not_equal(q, 100, 0), 100);
    fill(p, 50, 5);
    p = shard_heap_realloc(h, p, 5000);
    CHECK_PATTERN(p, 50, 5, "heap realloc");
    q[100] = 1; /* the bug */
    capture_begin();
    shard_heap_free(h, q);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_OVERFLOW, q);
    calls_reset();
    shard_heap_free(h, p);
    CHECK_EQ(calls.count, 0);
    shard_heap_destroy(h);
}

/* Threads: each allocates, fills, checks, reallocates and frees blocks of every kind, some freed by
 * another thread; nothing is reported. */
#define THREADS 8
static void *worker(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    void *held[64] = {0};
    size_t size[64] = {0};
    for (int i = 0; i < 20000; i++) {
        seed = harness_mix64(seed + (uint64_t)i);
        int k = (int)(seed % 64);
        if (held[k] != NULL) {
            CHECK_PATTERN(held[k], size[k], (uint64_t)k, "a thread's block");
            if (seed & 256) {
                size_t n = (size_t)(seed >> 20) % 3000;
                held[k] = shard_realloc(held[k], n);
                if (n < size[k])
                    size[k] = n;
                fill(held[k], n, (uint64_t)k);
                size[k] = n;
                continue;
            }
            shard_free(held[k]);
            held[k] = NULL;
            continue;
        }
        size[k] = (seed & 1023) == 0 ? 100 * KB + (size_t)(seed >> 40) % 50000 : (size_t)(seed >> 20) % 2000;
        held[k] = shard_malloc(size[k]);
        fill(held[k], size[k], (uint64_t)k);
    }
    for (int k = 0; k < 64; k++)
        shard_free(held[k]);
    return NULL;
}

TEST(many_threads)
{
    calls_reset();
    thread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK(thread_start(&t[i], worker, (void *)(uintptr_t)(i + 1)) == 0);
    for (int i = 0; i < THREADS; i++)
        thread_join(t[i]);
    CHECK_EQ(calls.count, 0);
    CHECK_EQ(check_quiet(), left_damaged);
}

#ifndef _WIN32
/* A fork while another thread is inside shard_check, blocked writing its report to a full pipe: the child
 * has no such thread, and its own shard_check must not wait for it (it did, for ever, on the lock that
 * keeps checks one at a time). The fork waits for nothing here either: the main thread forks while the
 * checking thread stays blocked until the main thread drains the pipe. */
static int thread_result, thread_done;

static void *check_in_thread(void *arg)
{
    (void)arg;
    thread_result = shard_check();
    __atomic_store_n(&thread_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

TEST(fork_while_another_thread_checks)
{
    flush_quarantine();
    calls_reset();
    unsigned char *p = plant_alloc(40);
    plant_free(p);
    p[20] = 0x41; /* a write after free: a check of the quarantine, from any thread, reports it */
    int fds[2];
    CHECK(pipe(fds) == 0);
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
    char junk[4096];
    memset(junk, '.', sizeof junk);
    while (write(fds[1], junk, sizeof junk) > 0)
        ;
    while (write(fds[1], junk, 1) > 0) /* full to the byte: the report's first write blocks */
        ;
    fcntl(fds[1], F_SETFL, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fds[1], 2);
    thread_t t;
    CHECK(thread_start(&t, check_in_thread, NULL) == 0);
    struct timespec ts = {0, 200 * 1000 * 1000}; /* the thread reaches its report and blocks there */
    nanosleep(&ts, NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 2);
        alarm(10);
        _exit(shard_check() == left_damaged + 1 ? 0 : 1);
    }
    close(fds[1]);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    while (!__atomic_load_n(&thread_done, __ATOMIC_ACQUIRE)) /* the pipe drained: the thread's report */
        if (read(fds[0], junk, sizeof junk) <= 0) {
            struct timespec ms = {0, 1000 * 1000};
            nanosleep(&ms, NULL);
        }
    thread_join(t);
    dup2(saved, 2);
    close(saved);
    close(fds[0]);
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child: %s %d",
           WIFSIGNALED(status) ? "killed by signal" : "exit status",
           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    CHECK(thread_result >= 1); /* the thread sees the quarantine, not the main thread's heap */
    CHECK_EQ(calls.count, 0);
    capture_begin();
    flush_quarantine();
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_WRITE_AFTER_FREE, p);
    calls_reset();
    CHECK_EQ(check_quiet(), left_damaged);
}
#endif

/* An overflow out of a live block into the header of the block after it, which waits in the quarantine:
 * that header holds the quarantine's link and the block's size. The overflow is reported when its block
 * is freed; the damaged neighbour when it leaves the quarantine (or shard_check looks), and neither the
 * quarantine nor the check follows or counts by what the overflow wrote there. (The blocks that waited
 * behind the damaged one stay out of use: last in this file, for the memory they keep.) */
TEST(overflow_into_a_quarantined_neighbours_header)
{
    calls_reset();
    flush_quarantine();
    unsigned char *a = NULL, *b = NULL, *last = plant_alloc(48);
    void *held[256];
    int n = 0;
    while (n < 255) { /* two blocks whose core blocks (128 bytes) lie next to each other */
        unsigned char *next = plant_alloc(48);
        if (next == last + 128) {
            a = last, b = next;
            break;
        }
        held[n++] = last;
        last = next;
    }
    CHECK(a != NULL);
    if (a == NULL)
        return;
    void *c = shard_malloc(48);
    shard_free(b);
    shard_free(c);            /* b's link in the quarantine leads to c */
    memset(a, 0x41, 48 + 40); /* the bug: a's trailer, then the first three words of b's core block */
    capture_begin();
    shard_free(a);
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_OVERFLOW, a);
    left_damaged++;
    CHECK(check_quiet() >= left_damaged + 1); /* b too, while it waits */
    calls_reset();
    capture_begin();
    flush_quarantine(); /* b leaves */
    capture_end();
    CHECK_ONE_CALL(SHARD_ERROR_HEADER, b);
    calls_reset();
    while (n > 0)
        shard_free(held[--n]);
    flush_quarantine();
    CHECK_EQ(calls.count, 0);
    CHECK_EQ(check_quiet(), left_damaged);
}

/* The error hook of the children below: it returns, but a fourth call ends the process (exit code 9). */
static int hook_calls;
static void count_and_return(void *arg, int error, void *ptr)
{
    (void)arg, (void)error, (void)ptr;
    if (++hook_calls > 3)
        _Exit(9);
}

/* A write after free into a block still in the quarantine when the program exits normally: reported at
 * exit (the quarantine is checked once more), with the default hook's abort. In a child process. */
static void child_action(const char *action)
{
    shard_set_error_hook(NULL, NULL); /* the default (a Linux child inherits the tests' recording hook) */
    if (strcmp(action, "write-after-free-then-exit") == 0) {
        char *p = shard_malloc(100);
        shard_free(p);
        p[10] = 'x';
        exit(0);
    }
    if (strncmp(action, "returning-hook-", 15) == 0) {
        /* A hook that returns: each damaged block is reported once, and the exit goes on. */
        shard_set_error_hook(count_and_return, NULL);
        char *p = shard_malloc(100);
        shard_free(p);
        if (strcmp(action, "returning-hook-trailer") == 0)
            p[100] = 'x'; /* its trailer's first byte */
        else
            p[-1] = 'x'; /* its header's canary */
        exit(0);
    }
    if (strcmp(action, "clean-exit") == 0) {
        char *p = shard_malloc(100);
        shard_free(p);
        exit(0);
    }
}

TEST(a_write_after_free_is_reported_at_exit)
{
    child_result r;
    child_run("write-after-free-then-exit", &r);
    CHECK(r.started);
    CHECKF(r.aborted, "the child ended with exit code %d, not by the default hook's abort", r.exit_code);
    CHECKF(strstr(r.err, "write after free") != NULL, "the child wrote: %s", r.err);
    child_run("clean-exit", &r);
    CHECK(r.started && !r.aborted && r.exit_code == 0);
    CHECKF(r.err[0] == 0, "the child wrote: %s", r.err);
}

/* The same at exit with a hook that returns: a quarantined block with a damaged trailer or header is
 * reported once and the program exits, rather than the check finding the same block again forever. */
TEST(a_damaged_quarantined_block_is_reported_once_at_exit)
{
    static const char *const actions[] = {"returning-hook-trailer", "returning-hook-canary"};
    for (int i = 0; i < 2; i++) {
        child_result r;
        child_run(actions[i], &r);
        CHECK(r.started);
        CHECKF(!r.aborted && r.exit_code == 0, "%s: the child ended with exit code %d", actions[i], r.exit_code);
        const char *first = strstr(r.err, "shardmm debug:");
        CHECKF(first != NULL && strstr(first + 1, "shardmm debug:") == NULL, "%s: the child wrote: %s", actions[i],
               r.err);
    }
}
