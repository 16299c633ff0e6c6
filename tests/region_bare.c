/* region_bare.c - shardmm with no operating system and no C library: the region port over a static
 * buffer, in a program linked with -nostdlib (Linux: -static and its own _start, raw write and exit
 * system calls; Windows: its own entry point and kernel32 for the output and the exit only). That the
 * program links at all proves that the core and the region port need nothing outside themselves; then
 * it allocates, frees and reallocs blocks of every kind and checks their contents, every address inside
 * the region, the error hook, and that everything is given back.
 *
 * Built with -DTEST_SINGLE_SLOT it runs over the single-file build of the region port with a global
 * heap slot (no slot function: one thread).
 *
 * Like the other test programs it prints "ok NAME" per test and "N passed, N failed" last.
 */
#include "shardmm_region.h"

#include <stddef.h>
#include <stdint.h>

/* ---- the platform: output and exit ------------------------------------------------------------------- */

#ifdef _WIN32
typedef void *handle_t;
__declspec(dllimport) handle_t __stdcall GetStdHandle(unsigned long which);
__declspec(dllimport) int __stdcall WriteFile(handle_t h, const void *data, unsigned long len, unsigned long *written,
                                              void *overlapped);
__declspec(dllimport) __attribute__((noreturn)) void __stdcall ExitProcess(unsigned code);
__declspec(dllimport) unsigned short __stdcall RtlCaptureStackBackTrace(unsigned long skip, unsigned long count,
                                                                       void **frames, unsigned long *hash);

static void out(const char *s, size_t len)
{
    unsigned long written;
    WriteFile(GetStdHandle((unsigned long)-11), s, (unsigned long)len, &written, 0);
}

static __attribute__((noreturn)) void leave(int code) { ExitProcess((unsigned)code); }
#else
static long sys3(long n, long a, long b, long c)
{
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return ret;
}

static void out(const char *s, size_t len) { sys3(1 /* write */, 1, (long)s, (long)len); }

static __attribute__((noreturn)) void leave(int code)
{
    for (;;)
        sys3(231 /* exit_group */, code, 0, 0);
}
#endif

static size_t length(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

static void say(const char *s) { out(s, length(s)); }

static void say_number(uint64_t v)
{
    char buf[24];
    int i = sizeof buf;
    do {
        buf[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    out(buf + i, sizeof buf - (size_t)i);
}

/* ---- the harness ------------------------------------------------------------------------------------- */

static int passed, failed, current_failed;

static void check_at(int ok, const char *what, int line)
{
    if (ok)
        return;
    say("  check failed: ");
    say(what);
    say(" (line ");
    say_number((uint64_t)line);
    say(")\n");
    current_failed = 1;
}
#define CHECK(c) check_at((c) != 0, #c, __LINE__)

static void run(const char *name, void (*fn)(void))
{
    current_failed = 0;
    fn();
    say(current_failed ? "FAIL " : "ok ");
    say(name);
    say("\n");
    if (current_failed)
        failed++;
    else
        passed++;
}

/* ---- the region ---------------------------------------------------------------------------------------- */

#define REGION_SIZE ((size_t)96 << 20)
static unsigned char region[REGION_SIZE] __attribute__((aligned(4096))); /* .bss: zero when the program starts */

static void region_error(const char *msg, size_t len)
{
    say("shardmm: ");
    out(msg, len);
}

static void region_abort(void) { leave(3); }

/* The heap slot: one thread, one word. On request it records the stack as Windows' unwinder sees it
 * from here (through the fast path's call of heap_slot_fetch, which has unwind data). */
static void *slot_word;
#ifdef _WIN32
static int capture_next;
static void *frames[32];
static unsigned frame_count;
#endif

static void **bare_slot(void)
{
#ifdef _WIN32
    if (capture_next) {
        capture_next = 0;
        frame_count = RtlCaptureStackBackTrace(0, 32, frames, 0);
    }
#endif
    return &slot_word;
}

static int inside(const void *p, size_t size)
{
    uintptr_t a = (uintptr_t)p, lo = (uintptr_t)region;
    return a >= lo && a + size <= lo + REGION_SIZE && a + size >= a;
}

/* A pattern of the block's address and a seed, byte by byte. */
static unsigned char pattern(const void *base, size_t i, unsigned seed)
{
    return (unsigned char)(((uintptr_t)base >> 4) + i * 7 + seed);
}

static void fill(unsigned char *p, size_t size, unsigned seed)
{
    for (size_t i = 0; i < size; i++)
        p[i] = pattern(p, i, seed);
}

/* Whether [p, p+size) holds the pattern written at `base`. */
static int holds(const unsigned char *p, size_t size, const void *base, unsigned seed)
{
    for (size_t i = 0; i < size; i++)
        if (p[i] != pattern(base, i, seed))
            return 0;
    return 1;
}

/* ---- the tests ----------------------------------------------------------------------------------------- */

static shard_stats stats_now(void)
{
    shard_stats s;
    shard_get_stats(&s);
    return s;
}

static size_t committed_at_start;

static void test_init_refuses_a_second_call_and_an_allocation_comes_from_the_region(void)
{
    static unsigned char other[1 << 20];
    CHECK(shard_region_init(other, sizeof other, 0) == -1); /* once only */
    void *p = shard_malloc(100);
    CHECK(p != 0 && inside(p, 100));
    shard_free(p);
}

/* Small, medium and large blocks of many sizes, each filled, all alive at once, then checked and freed. */
static void test_blocks_of_every_size_keep_their_contents(void)
{
    static const size_t sizes[] = {1, 16, 24, 100, 1000, 2048, 4000, 16384, 16385, 40000, 100000, 500000,
                                   1048576, 1048577, 1600000, 5000000};
    enum { N = sizeof sizes / sizeof *sizes, COPIES = 3 };
    unsigned char *p[N][COPIES];
    for (int c = 0; c < COPIES; c++)
        for (int i = 0; i < N; i++) {
            p[i][c] = shard_malloc(sizes[i]);
            CHECK(p[i][c] != 0 && inside(p[i][c], sizes[i]) && ((uintptr_t)p[i][c] & 15) == 0);
            CHECK(shard_usable_size(p[i][c]) >= sizes[i]);
            if (p[i][c] != 0)
                fill(p[i][c], sizes[i], (unsigned)(i + c));
        }
    for (int c = 0; c < COPIES; c++)
        for (int i = 0; i < N; i++)
            if (p[i][c] != 0) {
                CHECK(holds(p[i][c], sizes[i], p[i][c], (unsigned)(i + c)));
                shard_free(p[i][c]);
            }
    CHECK(shard_check() == 0);
}

static void test_calloc_gives_zeros_also_in_reused_memory(void)
{
    for (int round = 0; round < 3; round++) {
        static const size_t sizes[] = {64, 3000, 70000, 2000000};
        for (int i = 0; i < 4; i++) {
            unsigned char *p = shard_calloc(1, sizes[i]);
            CHECK(p != 0 && inside(p, sizes[i]));
            if (p == 0)
                continue;
            int zero = 1;
            for (size_t j = 0; j < sizes[i]; j++)
                zero &= p[j] == 0;
            CHECK(zero);
            fill(p, sizes[i], 9); /* the next round's calloc may get this memory back */
            shard_free(p);
        }
        shard_collect(); /* and decommitted pages committed again read zero too */
    }
}

/* A block grown from 10 bytes to 6 MB and shrunk back keeps what it held at every step. */
static void test_realloc_across_every_kind_keeps_the_contents(void)
{
    size_t size = 10;
    unsigned char *p = shard_malloc(size), *first = p;
    CHECK(p != 0);
    if (p == 0)
        return;
    fill(p, size, 5);
    while (size < ((size_t)6 << 20)) {
        size_t next = size * 3;
        unsigned char *q = shard_realloc(p, next);
        CHECK(q != 0 && inside(q, next));
        if (q == 0)
            break;
        CHECK(holds(q, size, first, 5));
        for (size_t i = size; i < next; i++)
            q[i] = pattern(first, i, 5);
        p = q;
        size = next;
    }
    while (size > 10) {
        size /= 5;
        unsigned char *q = shard_realloc(p, size);
        CHECK(q != 0 && holds(q, size, first, 5));
        if (q == 0)
            break;
        p = q;
    }
    shard_free(p);
}

static void test_aligned_blocks_are_aligned_and_usable(void)
{
    static const size_t aligns[] = {32, 256, 4096, 65536, (size_t)1 << 21, (size_t)4 << 20};
    for (int i = 0; i < 6; i++) {
        size_t size = aligns[i] + 1000;
        unsigned char *p = shard_malloc_aligned(size, aligns[i]);
        CHECK(p != 0 && ((uintptr_t)p & (aligns[i] - 1)) == 0 && inside(p, size));
        if (p == 0)
            continue;
        fill(p, size, 3);
        unsigned char *q = shard_realloc_aligned(p, size * 2, aligns[i]);
        CHECK(q != 0 && ((uintptr_t)q & (aligns[i] - 1)) == 0 && holds(q, size, p, 3));
        shard_free(q != 0 ? q : p);
    }
}

static int hook_calls;
static void *hook_ptr;

static void count_error(void *arg, int error, void *ptr)
{
    (void)arg;
    hook_calls += error == SHARD_ERROR_INVALID_FREE;
    hook_ptr = ptr;
}

/* A pointer that is no block of ours goes to the error hook, and nothing else changes. */
static void test_an_invalid_free_goes_to_the_error_hook(void)
{
    unsigned char *p = shard_malloc(200);
    CHECK(p != 0);
    if (p == 0)
        return;
    fill(p, 200, 1);
    shard_error_fn old = shard_set_error_hook(count_error, 0);
    shard_free(p + 8);
    shard_free(region + REGION_SIZE - 64); /* inside the region, but no block */
    shard_set_error_hook(old, 0);
    CHECK(hook_calls == 2 && hook_ptr == region + REGION_SIZE - 64);
    CHECK(holds(p, 200, p, 1));
    shard_free(p);
    CHECK(shard_check() == 0);
}

/* More than the region holds: NULL, and everything works again once the blocks are freed. */
static void test_filling_the_region_gives_null_and_then_recovers(void)
{
    enum { MAX = 64 };
    unsigned char *held[MAX];
    int n = 0;
    while (n < MAX && (held[n] = shard_malloc((size_t)8 << 20)) != 0) {
        fill(held[n], 4096, (unsigned)n);
        n++;
    }
    CHECK(n > 0 && n < MAX); /* 96 MB: some 8 MB blocks fit, not 64 of them */
    CHECK(shard_malloc((size_t)200 << 20) == 0);
    for (int i = 0; i < n; i++) {
        CHECK(holds(held[i], 4096, held[i], (unsigned)i));
        shard_free(held[i]);
    }
    shard_collect();
    unsigned char *again = shard_malloc((size_t)8 << 20);
    CHECK(again != 0);
    shard_free(again);
}

/* Windows: an unwinder that starts in the slot function gets through heap_slot_fetch and the fast path
 * to this test's caller (an exception thrown there, a debugger's or a profiler's stack walk). */
static __attribute__((noinline)) void test_the_stack_unwinds_through_the_slot_call(void)
{
#ifdef _WIN32
    void *back = __builtin_return_address(0); /* in run(), which called this test */
    frame_count = 0;
    capture_next = 1;
    void *p = shard_malloc(48);
    CHECK(p != 0 && frame_count >= 4);
    int found = 0;
    for (unsigned i = 0; i < frame_count; i++)
        found |= frames[i] == back;
    CHECK(found);
    shard_free(p);
#endif
}

/* After everything is freed and collected, the committed memory is what it was before the tests. */
static void test_everything_goes_back(void)
{
    shard_collect();
    shard_stats s = stats_now();
    CHECK(s.live_small == 0 && s.live_medium == 0 && s.live_large == 0);
    CHECK(s.committed <= committed_at_start + ((size_t)2 << 20));
    CHECK(shard_check() == 0);
}

static int bare_main(void)
{
    shard_region_options opt = {0};
    opt.write_error = region_error;
    opt.abort = region_abort;
    opt.flags = SHARD_REGION_ZEROED;
#ifndef TEST_SINGLE_SLOT /* the single-file build's slot is its own global word (SHARD_SLOT=PORT_SLOT_GLOBAL) */
    opt.slot = bare_slot;
#else
    opt.slot = bare_slot;
    if (shard_region_init(region, REGION_SIZE, &opt) != -1) {
        say("shard_region_init took a slot function with a global slot\n0 passed, 1 failed\n");
        return 1;
    }
    opt.slot = 0;
#endif
    if (shard_region_init(region, REGION_SIZE, &opt) != 0) {
        say("shard_region_init failed\n0 passed, 1 failed\n");
        return 1;
    }
    void *warm = shard_malloc(1); /* the heap and the map tables, which stay */
    shard_free(warm);
    committed_at_start = stats_now().committed;
    run("init_refuses_a_second_call_and_an_allocation_comes_from_the_region",
        test_init_refuses_a_second_call_and_an_allocation_comes_from_the_region);
    run("blocks_of_every_size_keep_their_contents", test_blocks_of_every_size_keep_their_contents);
    run("calloc_gives_zeros_also_in_reused_memory", test_calloc_gives_zeros_also_in_reused_memory);
    run("realloc_across_every_kind_keeps_the_contents", test_realloc_across_every_kind_keeps_the_contents);
    run("aligned_blocks_are_aligned_and_usable", test_aligned_blocks_are_aligned_and_usable);
    run("an_invalid_free_goes_to_the_error_hook", test_an_invalid_free_goes_to_the_error_hook);
    run("filling_the_region_gives_null_and_then_recovers", test_filling_the_region_gives_null_and_then_recovers);
    run("the_stack_unwinds_through_the_slot_call", test_the_stack_unwinds_through_the_slot_call);
    run("everything_goes_back", test_everything_goes_back);
    say_number((uint64_t)passed);
    say(" passed, ");
    say_number((uint64_t)failed);
    say(" failed\n");
    return failed != 0;
}

#ifdef _WIN32
void bare_start(void) { leave(bare_main()); }
#else
/* The process starts here: the stack aligned for a call, then exit with bare_main's result. */
__asm__(".text\n"
        ".globl _start\n"
        "_start:\n\t"
        "xorl %ebp, %ebp\n\t"
        "andq $-16, %rsp\n\t"
        "call bare_start\n\t"
        "hlt\n");
__attribute__((used, noreturn)) void bare_start(void) { leave(bare_main()); }
#endif
