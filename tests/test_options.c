/* test_options.c - the SHARDMM_ environment options (README.md's table), each checked in fresh
 * processes, with the variable set and without it.
 *
 * The options are read once, at the allocator's first allocation, so every case runs in a process of its
 * own: this program started again (fork and exec on Linux, CreateProcess on Windows) with
 * SHARD_OPTIONS_CHILD=<scenario> and the case's SHARDMM_ variables in its environment, and every other
 * SHARDMM_ variable removed. The child runs the scenario from a constructor, before main, and ends with
 * exit(0) (so that the exit-time options run: a destructor of the library on Linux, DLL_PROCESS_DETACH
 * on Windows); the parent reads what it wrote to stderr through a pipe and checks that the option changed
 * what the allocator says or does. A scenario writes its own findings as "child: ..." lines.
 *
 * Builds: build/test-options (the API library), build/test-options-static (libshardmm.a: the exit hook
 * is then a destructor of the program itself), build/win64/test-options.exe (the DLL, under Wine). The
 * Windows static library has no exit hook: there the exit-time options say so with SHARDMM_VERBOSE and
 * do nothing (TEST_NO_EXIT_HOOK).
 *
 * The leak report's list of blocks comes from shard_visit: report_leaks_lists_the_leaked_blocks_text
 * passes once src/walk.c walks the heaps.
 */
#define HARNESS_MAIN
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#else
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;

#include <errno.h>

#include "seccomp.h"
#include "smaps.h"
#endif

#include "shardmm.h"

#if defined(_WIN32) && !defined(SHARD_USE_DLL)
#define TEST_NO_EXIT_HOOK 1 /* the Windows static library (port/win64.c) */
#else
#define TEST_NO_EXIT_HOOK 0
#endif

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define CHILD_VARIABLE "SHARD_OPTIONS_CHILD"
#define LEAKED_TEXT "leaked-by-test-options"

/* ---- the scenarios (in the child) -------------------------------------------------------------------- */

static size_t cached_blocks(void)
{
    shard_stats s;
    shard_get_stats(&s);
    return s.large_cached;
}

/* Small blocks and a 3 MB one, kept; the child's own figure of committed memory last. */
void *test_options_kept[101]; /* global: the compiler cannot drop the blocks */

static void scenario_stats(void)
{
    for (int i = 0; i < 100; i++)
        test_options_kept[i] = shard_malloc(100);
    test_options_kept[100] = shard_malloc(3 * MB);
    memset(test_options_kept[100], 1, 3 * MB);
    shard_stats s;
    shard_get_stats(&s);
    fprintf(stderr, "child: committed %zu\n", s.committed);
}

/* A block with a text anyone can recognise, never freed. */
static void scenario_leak(void)
{
    char *p = shard_malloc(64);
    strcpy(p, LEAKED_TEXT);
    fprintf(stderr, "child: leaked %p\n", (void *)p);
}

/* A commit past shard_set_limit. */
static void scenario_limit(void)
{
    void *first = shard_malloc(100);
    shard_stats s;
    shard_get_stats(&s);
    shard_set_limit(s.committed + 64 * KB);
    void *big = shard_malloc(8 * MB);
    shard_set_limit(SIZE_MAX);
    fprintf(stderr, "child: limited malloc %s\n", big == NULL ? "NULL" : "a block");
    shard_free(big);
    shard_free(first);
}

/* Linux: 16 TB. Windows: 1 TB, as much as no machine of ours can commit either: Wine keeps a byte per
 * 4 KB page of a committed range, written at the commit, so a 16 TB commit it then refuses made the
 * process resident for 8 GB (a 24 GB machine running tests/run came close to its out-of-memory killer). */
#ifdef _WIN32
#define HUGE_REQUEST ((size_t)1 << 40)
#else
#define HUGE_REQUEST ((size_t)16 << 40)
#endif

/* The OS refuses: a commit no machine can back (HUGE_REQUEST: the reservation may pass, its commit not); on
 * Linux also a reservation past RLIMIT_AS. */
static void scenario_os_refusal(void)
{
    void *first = shard_malloc(100);
    void *huge = shard_malloc(HUGE_REQUEST);
    fprintf(stderr, "child: huge malloc %s\n", huge == NULL ? "NULL" : "a block");
#ifndef _WIN32
    struct rlimit lim;
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f != NULL && fscanf(f, "%lu", &pages) == 1) {
        lim.rlim_cur = lim.rlim_max = (rlim_t)pages * 4096 + 256 * MB;
        setrlimit(RLIMIT_AS, &lim);
        void *big = shard_malloc(1024 * MB);
        fprintf(stderr, "child: 1 GB malloc under RLIMIT_AS %s\n", big == NULL ? "NULL" : "a block");
    }
    if (f != NULL)
        fclose(f);
#endif
    shard_free(first);
}

static int hook_calls;
static void counting_hook(void *arg, int error, void *p)
{
    (void)arg, (void)error, (void)p;
    hook_calls++;
}

/* An invalid free, with an error hook that returns. */
static void scenario_invalid_free(void)
{
    static char not_ours[64];
    void *first = shard_malloc(100);
    shard_set_error_hook(counting_hook, NULL);
    shard_free(not_ours + 16);
    fprintf(stderr, "child: hook calls %d\n", hook_calls);
    shard_free(first);
}

/* A block freed into the large-block cache, then a large request that does not fit it. */
static void scenario_cache_delay(void)
{
    void *a = shard_malloc(8 * MB);
    shard_free(a);
    size_t after_free = cached_blocks();
    void *b = shard_malloc(64 * MB);
    fprintf(stderr, "child: cached %zu %zu\n", after_free, cached_blocks());
    shard_free(b);
}

/* An 8 MB block freed, then a 2 MB one: how many the cache holds after each. */
static void scenario_cache_size(void)
{
    void *a = shard_malloc(8 * MB);
    memset(a, 1, 8 * MB);
    shard_free(a);
    size_t after_8 = cached_blocks();
    void *b = shard_malloc(2 * MB);
    memset(b, 1, 2 * MB);
    shard_free(b);
    fprintf(stderr, "child: cached %zu %zu\n", after_8, cached_blocks());
}

/* A thread frees a 3 MB block; then this thread's malloc(3 MB): the same block (from the cache) or
 * another (the block waits in the thread's spare while it lives). */
static void *spare_free(void *arg)
{
    void **p = arg;
    *p = shard_malloc(3 * MB);
    memset(*p, 1, 3 * MB);
    shard_free(*p);
    return NULL;
}
#ifdef _WIN32
static DWORD WINAPI spare_free_win(LPVOID arg)
{
    spare_free(arg);
    Sleep(300); /* alive while the other thread allocates: the spare is still its */
    return 0;
}
#else
static void *spare_free_wait(void *arg)
{
    spare_free(((void **)arg)[0]);
    while (!__atomic_load_n((int *)((void **)arg)[1], __ATOMIC_ACQUIRE))
        usleep(1000);
    return NULL;
}

/* Thread t runs spare_free_wait on args = {freed, done}; back once its block is freed and counted. */
static void spare_free_started(pthread_t *t, void **args)
{
    pthread_create(t, NULL, spare_free_wait, args);
    while (__atomic_load_n((void **)args[0], __ATOMIC_ACQUIRE) == NULL || cached_blocks() == 0)
        usleep(1000);
}
#endif

static void scenario_spare(void)
{
    void *freed = NULL;
#ifdef _WIN32
    HANDLE t = CreateThread(NULL, 0, spare_free_win, &freed, 0, NULL);
    while (__atomic_load_n(&freed, __ATOMIC_ACQUIRE) == NULL || cached_blocks() == 0)
        Sleep(1);
    void *mine = shard_malloc(3 * MB);
    WaitForSingleObject(t, INFINITE);
#else
    int done = 0;
    void *args[2] = {&freed, &done};
    pthread_t t;
    spare_free_started(&t, args);
    void *mine = shard_malloc(3 * MB);
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
#endif
    fprintf(stderr, "child: spare %s\n", mine == freed ? "same" : "other");
    shard_free(mine);
}

#ifndef _WIN32
/* A counter of /proc/vmstat (the whole system's), 0 if it is not there. */
static unsigned long vmstat(const char *name)
{
    FILE *f = fopen("/proc/vmstat", "r");
    char key[64];
    unsigned long value, found = 0;
    while (f != NULL && fscanf(f, "%63s %lu", key, &value) == 2)
        if (strcmp(key, name) == 0)
            found = value;
    if (f != NULL)
        fclose(f);
    return found;
}

/* `bytes` of 64-byte blocks, written; then the AnonHugePages of the mappings that hold them, summed over
 * /proc/self/smaps (each mapping once), and how many segments they span. */
static void huge_pages_under(size_t bytes)
{
    enum { SEGMENTS_MAX = 64 };
    static uintptr_t segments[SEGMENTS_MAX];
    size_t n_segments = 0;
    unsigned long fallback_before = vmstat("thp_fault_fallback");
    for (size_t i = 0; i < bytes / 64; i++) {
        char *p = shard_malloc(64);
        memset(p, 1, 64);
        uintptr_t seg = (uintptr_t)p & ~(uintptr_t)(4 * MB - 1);
        size_t k = 0;
        while (k < n_segments && segments[k] != seg)
            k++;
        if (k == n_segments && n_segments < SEGMENTS_MAX)
            segments[n_segments++] = seg;
    }
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    unsigned long lo, hi, kb, huge = 0;
    int ours = 0;
    while (f != NULL && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            ours = 0; /* a mapping that overlaps a segment (a hint can split a segment in two) */
            for (size_t k = 0; k < n_segments; k++)
                ours |= segments[k] < hi && segments[k] + 4 * MB > lo;
        } else if (ours && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) {
            huge += kb;
        }
    }
    if (f != NULL)
        fclose(f);
    fprintf(stderr, "child: huge %lu KB in %zu segments, %lu fallbacks\n", huge, n_segments,
            vmstat("thp_fault_fallback") - fallback_before);
}

/* The AnonHugePages of the mappings that overlap the 4 MB at seg. */
static unsigned long huge_kb_in(uintptr_t seg) { return huge_kb_over(seg, seg + 4 * MB, NULL); }

/* A heap that uses every page of its first segment's spared 2 MB (64-byte blocks up to the last below
 * 2 MB, all of page 31, the last page there), and a medium arena past 512 KB (32 KB blocks up to the first
 * beyond 576 KB: the arena's first 64 KB and eight commits more), each block written with its pattern:
 * the core asks for huge pages in both spared units (the hint), and they keep what they held. The
 * first is the process's first collapse, which the Linux port makes whatever it costs (linux.c); the
 * second it weighs, and may pass over. Neither segment's upper 2 MB is touched, so any huge page in
 * them is the lower one's. */
static void scenario_huge_pages_spared(void)
{
    enum { SMALL_MAX = 32 * 1024, MEDIUM_MAX = 64 };
    static uint64_t *small[SMALL_MAX], *medium[MEDIUM_MAX];
    size_t n_small = 0, n_medium = 0, bad = 0;
    unsigned long fallback_before = vmstat("thp_fault_fallback");
    uintptr_t seg = 0, arena = 0;
    while (n_small < SMALL_MAX) {
        uint64_t *p = shard_malloc(64);
        for (size_t w = 0; w < 8; w++)
            p[w] = (uint64_t)(uintptr_t)p * 31 + w;
        small[n_small++] = p;
        seg = (uintptr_t)small[0] & ~(uintptr_t)(4 * MB - 1);
        if ((uintptr_t)p - seg >= 2 * MB - 64)
            break;
    }
    while (n_medium < MEDIUM_MAX) {
        uint64_t *p = shard_malloc(32768);
        for (size_t w = 0; w < 4096; w += 511)
            p[w] = (uint64_t)(uintptr_t)p * 7 + w;
        medium[n_medium++] = p;
        arena = (uintptr_t)medium[0] & ~(uintptr_t)(4 * MB - 1);
        if ((uintptr_t)p + 32768 - arena > 9 * 65536)
            break;
    }
    for (size_t i = 0; i < n_small; i++)
        for (size_t w = 0; w < 8; w++)
            bad += small[i][w] != (uint64_t)(uintptr_t)small[i] * 31 + w;
    for (size_t i = 0; i < n_medium; i++)
        for (size_t w = 0; w < 4096; w += 511)
            bad += medium[i][w] != (uint64_t)(uintptr_t)medium[i] * 7 + w;
    int hinted;
    unsigned long medium_kb = huge_kb_over(arena, arena + 1, &hinted); /* the mapping of the arena's start */
    fprintf(stderr, "child: spared small %lu KB, medium %lu KB hinted %d, %zu bad words, %lu fallbacks\n",
            huge_kb_in(seg), medium_kb, hinted, bad, vmstat("thp_fault_fallback") - fallback_before);
    for (size_t i = 0; i < n_small; i++)
        shard_free(small[i]);
    for (size_t i = 0; i < n_medium; i++)
        shard_free(medium[i]);
}

/* In a heap of its own (a thread's): `blocks` medium blocks of 32 KB in its first arena, then 64-byte
 * blocks until its first segment's spared 2 MB is full (as above), every block checked; the KB of huge
 * pages in the arena's mapping then, -2 when it has no huge-page hint (the core did not ask), or -1
 * when a block lost its pattern. */
static void *medium_then_small(void *arg)
{
    enum { SMALL_MAX = 32 * 1024 };
    static uint64_t *small[SMALL_MAX];
    uint64_t *medium[16];
    size_t n_small = 0, n_medium = (size_t)(uintptr_t)arg, bad = 0;
    for (size_t i = 0; i < n_medium; i++) {
        medium[i] = shard_malloc(32768);
        for (size_t w = 0; w < 4096; w += 511)
            medium[i][w] = (uint64_t)(uintptr_t)medium[i] * 7 + w;
    }
    uintptr_t arena = (uintptr_t)medium[0] & ~(uintptr_t)(4 * MB - 1), seg = 0;
    uint32_t ends = 0; /* the pages of the lower 2 MB whose last item was handed out: full (a page a bit) */
    while (n_small < SMALL_MAX) {
        uint64_t *p = shard_malloc(64);
        p[0] = (uint64_t)(uintptr_t)p * 31;
        small[n_small++] = p;
        seg = (uintptr_t)small[0] & ~(uintptr_t)(4 * MB - 1);
        uintptr_t at = (uintptr_t)p - seg; /* the segment hands its lower pages out from its colour's on */
        if (at < 2 * MB && at % (64 * 1024) == 64 * 1024 - 64)
            ends |= (uint32_t)1 << (at / (64 * 1024));
        if (ends == 0xfffffffeu) /* pages 1-31 (page 0 holds the descriptors) */
            break;
    }
    int hinted;
    unsigned long kb = huge_kb_over(arena, arena + 1, &hinted); /* the mapping that holds the arena's start */
    long huge = hinted ? (long)kb : -2;
    for (size_t i = 0; i < n_small; i++) {
        bad += small[i][0] != (uint64_t)(uintptr_t)small[i] * 31;
        shard_free(small[i]);
    }
    for (size_t i = 0; i < n_medium; i++) {
        for (size_t w = 0; w < 4096; w += 511)
            bad += medium[i][w] != (uint64_t)(uintptr_t)medium[i] * 7 + w;
        shard_free(medium[i]);
    }
    return (void *)(intptr_t)(bad == 0 ? huge : -1);
}

/* heap_of(8) in this thread, then heap_of(3) in a new one, while this thread's heap still lives; prints
 * what each returned as "child: <what> R8 KB with 8 blocks, R3 KB with 3, N fallbacks". */
static void two_heaps(void *(*heap_of)(void *), const char *what)
{
    unsigned long fallback_before = vmstat("thp_fault_fallback");
    pthread_t t;
    void *few = NULL, *quarter = heap_of((void *)(uintptr_t)8);
    if (pthread_create(&t, NULL, heap_of, (void *)(uintptr_t)3) == 0)
        pthread_join(t, &few);
    fprintf(stderr, "child: %s %ld KB with 8 blocks, %ld KB with 3, %lu fallbacks\n", what, (long)(intptr_t)quarter,
            (long)(intptr_t)few, vmstat("thp_fault_fallback") - fallback_before);
}

/* A heap that fills its small spared unit with a quarter of its medium one committed (8 blocks of 32 KB:
 * 4 commits of 64 KB past the arena's first, of 8) asks for huge pages in the arena's unit too (which
 * the port weighs, as any collapse after the first); one with 3 blocks (1 commit) keeps it on small
 * pages. Each in a thread, both alive at once (two heaps). */
static void scenario_huge_pages_spared_both(void) { two_heaps(medium_then_small, "arena"); }

/* A seccomp filter under which membarrier fails (ENOSYS, as on a kernel before 4.14): 0, or -1 where
 * the process may not install one. */
static int membarrier_refused(void)
{
    struct sock_filter code[] = {
        FILTER_ONE_CALL(SYS_membarrier),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
    };
    return filter_install(code, sizeof code / sizeof code[0], 0);
}

/* A thread frees a 3 MB block, which waits in its spare, and waits; this thread collects. With
 * SHARD_TEST_NO_MEMBARRIER set, under membarrier_refused from before the first allocation (or "no
 * filter" where that fails). Prints the blocks cached (the spare among them) before and after. */
static void scenario_spare_unfenced(void)
{
    if (getenv("SHARD_TEST_NO_MEMBARRIER") != NULL && membarrier_refused() != 0) {
        fprintf(stderr, "child: no filter\n");
        return;
    }
    void *freed = NULL;
    int done = 0;
    void *args[2] = {&freed, &done};
    pthread_t t;
    spare_free_started(&t, args);
    size_t before = cached_blocks();
    shard_collect();
    size_t after = cached_blocks();
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    fprintf(stderr, "child: cached %zu before, %zu after\n", before, after);
}

/* A seccomp filter under which MADV_COLLAPSE fails (EINVAL, as on a kernel before 6.1): 0, or -1 where
 * the process may not install one. */
static int collapse_refused(void)
{
    struct sock_filter code[] = {
        FILTER_ONE_CALL(SYS_madvise),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 25 /* MADV_COLLAPSE */, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    return filter_install(code, sizeof code / sizeof code[0], 0);
}

/* A heap of 3 MB of 64-byte blocks, each written: its first segment's lower 2 MB is full, its upper 2 MB
 * half used. The KB of huge pages in the mapping of the upper unit's start, whether it has the hint, and
 * how many blocks lost their pattern; with SHARD_TEST_NO_COLLAPSE set, under collapse_refused (or
 * "no filter" where that fails). */
static void scenario_huge_pages_upper(void)
{
    if (getenv("SHARD_TEST_NO_COLLAPSE") != NULL && collapse_refused() != 0) {
        fprintf(stderr, "child: no filter\n");
        return;
    }
    enum { BLOCKS = 3 * 1024 * 1024 / 64 };
    static uint64_t *blocks[BLOCKS];
    size_t bad = 0;
    for (size_t i = 0; i < BLOCKS; i++) {
        blocks[i] = shard_malloc(64);
        for (size_t w = 0; w < 8; w++)
            blocks[i][w] = (uint64_t)(uintptr_t)blocks[i] * 13 + w;
    }
    uintptr_t seg = (uintptr_t)blocks[0] & ~(uintptr_t)(4 * MB - 1);
    int hinted;
    unsigned long kb = huge_kb_over(seg + 2 * MB, seg + 2 * MB + 1, &hinted);
    for (size_t i = 0; i < BLOCKS; i++) {
        for (size_t w = 0; w < 8; w++)
            bad += blocks[i][w] != (uint64_t)(uintptr_t)blocks[i] * 13 + w;
        shard_free(blocks[i]);
    }
    fprintf(stderr, "child: upper unit %lu KB hinted %d, %zu bad words\n", kb, hinted, bad);
}

/* One block of each size class that has pages of its own (16 B to 6656 B: 36 classes, 36 pages, so a
 * heap's first 2 MB is committed whole with about 200 KB of it touched), each filled with its pattern;
 * the highest address. */
enum { SPARSE_CLASSES = 36 };
static const size_t sparse_sizes[SPARSE_CLASSES] = {
    16,   32,   64,   80,   96,   112,  128,  160,  192,  224,  256,  320,  384,  448,  512,  640,  768,  896,
    1024, 1280, 1536, 1792, 2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096, 4608, 5120, 5632, 6144, 6656};

static uintptr_t sparse_blocks(uint8_t **blocks)
{
    uintptr_t highest = 0;
    for (size_t i = 0; i < SPARSE_CLASSES; i++) {
        blocks[i] = shard_malloc(sparse_sizes[i]);
        memset(blocks[i], (int)(i * 7 + 1), sparse_sizes[i]);
        highest = (uintptr_t)blocks[i] > highest ? (uintptr_t)blocks[i] : highest;
    }
    return highest;
}

/* sparse_blocks' blocks checked and freed: the bytes that lost their pattern. */
static size_t sparse_blocks_free(uint8_t **blocks)
{
    size_t bad = 0;
    for (size_t i = 0; i < SPARSE_CLASSES; i++) {
        for (size_t b = 0; b < sparse_sizes[i]; b++)
            bad += blocks[i][b] != (uint8_t)(i * 7 + 1);
        shard_free(blocks[i]);
    }
    return bad;
}

/* In a heap of its own (a thread's): `blocks` medium blocks of 32 KB in its first arena, each written,
 * then sparse_blocks, whose 36 pages take the 31 of its first segment's lower 2 MB and 5 of the upper
 * 2 MB with little of either touched. Returns the KB of huge pages in the mapping of the upper unit's
 * start, -2 when that mapping has no huge-page hint, or -1 when a block lost its pattern or did not
 * reach the upper unit. */
static void *medium_then_sparse(void *arg)
{
    uint64_t *medium[16];
    size_t n_medium = (size_t)(uintptr_t)arg, bad = 0;
    for (size_t i = 0; i < n_medium; i++) {
        medium[i] = shard_malloc(32768);
        for (size_t w = 0; w < 4096; w++)
            medium[i][w] = (uint64_t)(uintptr_t)medium[i] * 11 + w;
    }
    uint8_t *blocks[SPARSE_CLASSES];
    uintptr_t highest = sparse_blocks(blocks);
    uintptr_t seg = (uintptr_t)blocks[0] & ~(uintptr_t)(4 * MB - 1);
    int hinted;
    unsigned long kb = huge_kb_over(seg + 2 * MB, seg + 2 * MB + 1, &hinted);
    bad += sparse_blocks_free(blocks);
    for (size_t i = 0; i < n_medium; i++) {
        for (size_t w = 0; w < 4096; w++)
            bad += medium[i][w] != (uint64_t)(uintptr_t)medium[i] * 11 + w;
        shard_free(medium[i]);
    }
    if (bad != 0 || highest - seg < 2 * MB)
        return (void *)(intptr_t)-1;
    return (void *)(intptr_t)(hinted ? (long)kb : -2);
}

/* Two heaps that reach the upper 2 MB of their first segment with little of the lower touched: one with a
 * quarter of its arena's spared unit committed (8 blocks of 32 KB: 4 commits of 64 KB past its first),
 * one with 1 commit (3 blocks). Each in a thread, both alive at once. */
static void scenario_huge_pages_upper_early(void) { two_heaps(medium_then_sparse, "upper unit"); }

/* A heap that commits every 64 KB page of its first segment's lower 2 MB but touches little of it
 * (sparse_blocks). The KB of huge pages in the mapping of the segment's start, whether it has
 * the hint, whether the blocks reached past the lower unit, and how many bytes lost their pattern. */
static void scenario_huge_pages_sparse(void)
{
    uint8_t *blocks[SPARSE_CLASSES];
    uintptr_t highest = sparse_blocks(blocks);
    uintptr_t seg = (uintptr_t)blocks[0] & ~(uintptr_t)(4 * MB - 1);
    int hinted;
    unsigned long kb = huge_kb_over(seg, seg + 1, &hinted);
    size_t bad = sparse_blocks_free(blocks);
    fprintf(stderr, "child: lower unit %lu KB hinted %d, past it %d, %zu bad bytes\n", kb, hinted,
            highest - seg >= 2 * MB, bad);
}

/* A heap whose first segment is committed whole with little of it touched (sparse_blocks, then 64-byte
 * blocks, each written, in the rest of it: about 2 MB of 4 MB touched), until a block lies in a second
 * segment. Whether the mapping at the first segment's start has the huge-page hint then, whether a
 * second segment came, and how many words and bytes lost their pattern. */
static void scenario_huge_pages_outgrown(void)
{
    enum { MOST = 32 * 1024 };
    static uint64_t *small[MOST];
    uint8_t *blocks[SPARSE_CLASSES];
    sparse_blocks(blocks);
    uintptr_t seg = (uintptr_t)blocks[0] & ~(uintptr_t)(4 * MB - 1);
    size_t n = 0, bad = 0;
    int second = 0;
    while (n < MOST && !second) {
        uint64_t *p = shard_malloc(64);
        for (size_t w = 0; w < 8; w++)
            p[w] = (uint64_t)(uintptr_t)p * 29 + w;
        small[n++] = p;
        second = ((uintptr_t)p & ~(uintptr_t)(4 * MB - 1)) != seg;
    }
    int hinted;
    huge_kb_over(seg, seg + 1, &hinted);
    for (size_t i = 0; i < n; i++) {
        for (size_t w = 0; w < 8; w++)
            bad += small[i][w] != (uint64_t)(uintptr_t)small[i] * 29 + w;
        shard_free(small[i]);
    }
    bad += sparse_blocks_free(blocks);
    fprintf(stderr, "child: lower unit hinted %d, second segment %d, %zu bad\n", hinted, second, bad);
}

/* A heap that carves 2.5 MB in its first segment's lower 2 MB but over the same 700 KB of it: 640 KB of
 * 64-byte blocks, each written and checked, all freed, then as much again of 128-, 256- and 512-byte
 * blocks, in the pages the last round freed. The KB of huge pages in the mapping of the segment's start,
 * whether it has the hint, and how many words lost their pattern. */
static void scenario_huge_pages_recarved(void)
{
    enum { ROUND = 640 * 1024, MOST = ROUND / 64 };
    static uint64_t *blocks[MOST];
    size_t bad = 0;
    uintptr_t seg = 0;
    for (size_t size = 64; size <= 512; size *= 2) {
        size_t n = ROUND / size, words = size / 8;
        for (size_t i = 0; i < n; i++) {
            blocks[i] = shard_malloc(size);
            for (size_t w = 0; w < words; w++)
                blocks[i][w] = (uint64_t)(uintptr_t)blocks[i] * 17 + w + size;
        }
        seg = (uintptr_t)blocks[0] & ~(uintptr_t)(4 * MB - 1);
        for (size_t i = 0; i < n; i++) {
            for (size_t w = 0; w < words; w++)
                bad += blocks[i][w] != (uint64_t)(uintptr_t)blocks[i] * 17 + w + size;
            shard_free(blocks[i]);
        }
    }
    int hinted;
    unsigned long kb = huge_kb_over(seg, seg + 1, &hinted);
    fprintf(stderr, "child: lower unit %lu KB hinted %d, %zu bad words\n", kb, hinted, bad);
}

/* A heap that grows to 16 MB of small blocks, and one of 1 MB, which stays in its first 2 MB. */
static void scenario_huge_pages(void) { huge_pages_under(16 * MB); }
static void scenario_huge_pages_small(void) { huge_pages_under(1 * MB); }

/* The C library's environ emptied before the allocator starts: the port reads /proc/self/environ. */
static void scenario_environ_cleared(void)
{
    clearenv();
    scenario_cache_size();
}

/* 1 KB blocks, one at a time, each written whole, from the first page of their class: into resident[m]
 * the page's resident OS pages when the first block in its OS page os_page[m] (from 0, ascending) is
 * handed out; then every block checked and freed. Returns the bytes that had changed. */
static size_t carve_marks(const unsigned *os_page, long *resident, unsigned marks)
{
    enum { SIZE = 1024, MOST = 256 };
    static unsigned char *blocks[MOST];
    size_t n = 0, bad = 0;
    uintptr_t page = 0;
    int first; /* of the page's OS pages, resident: not asked */
    for (unsigned m = 0; m < marks; m++)
        resident[m] = -1;
    while (n < MOST && resident[marks - 1] < 0) {
        unsigned char *p = shard_malloc(SIZE);
        memset(p, (int)(n * 7 + 1) & 0xff, SIZE);
        blocks[n++] = p;
        if (page == 0 && ((uintptr_t)p & 0xffff) == 0)
            page = (uintptr_t)p; /* a fresh page's first item */
        for (unsigned m = 0; m < marks && page != 0; m++)
            if ((uintptr_t)p - page == os_page[m] * 4096)
                resident[m] = resident_pages((unsigned char *)page, 65536, &first);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < SIZE; k++)
            bad += blocks[i][k] != ((i * 7 + 1) & 0xff);
    for (size_t i = 0; i < n; i++)
        shard_free(blocks[i]);
    return bad;
}

/* The process's first segment is spared (on 4 KB pages): its third OS page and its ninth. */
static void scenario_carve_resident(void)
{
    static const unsigned os_page[2] = {2, 8};
    long r[2];
    size_t bad = carve_marks(os_page, r, 2);
    fprintf(stderr, "child: resident %ld at the third OS page, %ld at the ninth, %zu bad bytes\n", r[0], r[1],
            bad);
}

/* Run with SHARDMM_HUGE_PAGES=0: no segment hinted, no page made resident ahead, so an OS page is
 * resident once a block or a carve's link is written in it. Its OS pages 1, 2, 3, 5 and 9 (from 1). */
static void scenario_carve_batches(void)
{
    static const unsigned os_page[5] = {0, 1, 2, 4, 8};
    long r[5];
    size_t bad = carve_marks(os_page, r, 5);
    fprintf(stderr, "child: resident %ld %ld %ld %ld %ld, %zu bad bytes\n", r[0], r[1], r[2], r[3], r[4], bad);
}
#endif

static const struct {
    const char *name;
    void (*run)(void);
} scenarios[] = {
    {"stats", scenario_stats},
    {"leak", scenario_leak},
    {"limit", scenario_limit},
    {"os-refusal", scenario_os_refusal},
    {"invalid-free", scenario_invalid_free},
    {"cache-delay", scenario_cache_delay},
    {"cache-size", scenario_cache_size},
    {"spare", scenario_spare},
#ifndef _WIN32
    {"environ-cleared", scenario_environ_cleared},
    {"huge-pages", scenario_huge_pages},
    {"huge-pages-small", scenario_huge_pages_small},
    {"huge-pages-spared", scenario_huge_pages_spared},
    {"huge-pages-spared-both", scenario_huge_pages_spared_both},
    {"huge-pages-upper", scenario_huge_pages_upper},
    {"spare-unfenced", scenario_spare_unfenced},
    {"huge-pages-upper-early", scenario_huge_pages_upper_early},
    {"huge-pages-sparse", scenario_huge_pages_sparse},
    {"huge-pages-recarved", scenario_huge_pages_recarved},
    {"huge-pages-outgrown", scenario_huge_pages_outgrown},
    {"carve-resident", scenario_carve_resident},
    {"carve-batches", scenario_carve_batches},
#endif
};

__attribute__((constructor)) static void options_child(void)
{
    const char *name = getenv(CHILD_VARIABLE);
    if (name == NULL)
        return;
    for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++) {
        if (strcmp(scenarios[i].name, name) == 0) {
            scenarios[i].run();
            fflush(stderr);
            exit(0); /* a normal exit: the exit-time options run */
        }
    }
    fprintf(stderr, "child: no scenario %s\n", name);
    exit(2);
}

/* ---- running a child (in the parent) ------------------------------------------------------------------ */

typedef struct child {
    int ran;        /* it started and exited 0 */
    char err[32768]; /* what it wrote to stderr, NUL-terminated */
} child;

static size_t add_option_name(char *buf, size_t cap, size_t n, const char *entry)
{
    const char *eq = strchr(entry, '=');
    size_t len = eq != NULL ? (size_t)(eq - entry) : strlen(entry);
    if (strncmp(entry, "SHARDMM_", 8) != 0 || n + len + 1 > cap)
        return n;
    memcpy(buf + n, entry, len);
    buf[n + len] = 0;
    return n + len + 1;
}

/* The names of the SHARDMM_ variables in the environment, each ended by a zero byte, into buf. */
static size_t option_names(char *buf, size_t cap)
{
    size_t n = 0;
#ifdef _WIN32
    char *block = GetEnvironmentStringsA();
    for (const char *e = block; e != NULL && *e != 0; e += strlen(e) + 1)
        n = add_option_name(buf, cap, n, e);
    if (block != NULL)
        FreeEnvironmentStringsA(block);
#else
    for (char **env = environ; env != NULL && *env != NULL; env++)
        n = add_option_name(buf, cap, n, *env);
#endif
    return n;
}

static void set_variable(const char *name, const char *value)
{
#ifdef _WIN32
    SetEnvironmentVariableA(name, value);
#else
    if (value != NULL)
        setenv(name, value, 1);
    else
        unsetenv(name);
#endif
}

/* Set (value) or remove (NULL) the variables of "NAME=value" assignments. */
static void assign(const char *const *vars, int set)
{
    for (; vars != NULL && *vars != NULL; vars++) {
        char name[128];
        const char *eq = strchr(*vars, '=');
        size_t len = (size_t)(eq - *vars);
        memcpy(name, *vars, len);
        name[len] = 0;
        set_variable(name, set ? eq + 1 : NULL);
    }
}

/* The environment of a child: the scenario, the variables given, no other SHARDMM_ one. On Windows
 * the parent's own environment is changed for the CreateProcess and put back after it (Windows copies
 * it into the child); on Linux the forked child changes its own before exec. */
static void child_environment(const char *scenario, const char *const *vars, int set)
{
    char names[4096];
    size_t n = set ? option_names(names, sizeof names) : 0;
    for (size_t at = 0; at < n; at += strlen(names + at) + 1)
        set_variable(names + at, NULL);
    set_variable(CHILD_VARIABLE, set ? scenario : NULL);
    assign(vars, set);
}

#ifdef _WIN32
static void run_child(const char *scenario, const char *const *vars, child *c)
{
    char exe[MAX_PATH];
    SECURITY_ATTRIBUTES sa = {sizeof sa, NULL, TRUE};
    HANDLE rd = NULL, wr = NULL;
    STARTUPINFOA si;
    PROCESS_INFORMATION pi;
    DWORD n, code = 1;
    size_t got = 0;
    c->ran = 0;
    c->err[0] = 0;
    if (GetModuleFileNameA(NULL, exe, sizeof exe) == 0 || !CreatePipe(&rd, &wr, &sa, 0))
        return;
    SetHandleInformation(rd, HANDLE_FLAG_INHERIT, 0);
    memset(&si, 0, sizeof si);
    si.cb = sizeof si;
    si.dwFlags = STARTF_USESTDHANDLES;
    si.hStdInput = GetStdHandle(STD_INPUT_HANDLE);
    si.hStdOutput = wr;
    si.hStdError = wr;
    char saved[4096]; /* the parent's own SHARDMM_ variables would go to the child: none are expected */
    CHECKF(option_names(saved, sizeof saved) == 0, "the test's environment holds SHARDMM_ variables");
    child_environment(scenario, vars, 1);
    BOOL ok = CreateProcessA(exe, NULL, NULL, NULL, TRUE, 0, NULL, NULL, &si, &pi);
    child_environment(scenario, vars, 0);
    CloseHandle(wr);
    if (!ok) {
        CloseHandle(rd);
        return;
    }
    while (got + 1 < sizeof c->err && ReadFile(rd, c->err + got, (DWORD)(sizeof c->err - 1 - got), &n, NULL) && n > 0)
        got += n;
    c->err[got] = 0;
    CloseHandle(rd);
    WaitForSingleObject(pi.hProcess, INFINITE);
    GetExitCodeProcess(pi.hProcess, &code);
    CloseHandle(pi.hProcess);
    CloseHandle(pi.hThread);
    c->ran = code == 0;
}
#else
static void run_child(const char *scenario, const char *const *vars, child *c)
{
    char self[4096];
    int fds[2], status = 0;
    size_t got = 0;
    ssize_t n;
    c->ran = 0;
    c->err[0] = 0;
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0 || pipe(fds) != 0)
        return;
    self[len] = 0;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        child_environment(scenario, vars, 1);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        alarm(60);
        execl(self, self, (char *)NULL);
        _exit(95);
    }
    close(fds[1]);
    while (got + 1 < sizeof c->err && (n = read(fds[0], c->err + got, sizeof c->err - 1 - got)) > 0)
        got += (size_t)n;
    c->err[got] = 0;
    close(fds[0]);
    if (pid > 0 && waitpid(pid, &status, 0) == pid)
        c->ran = WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
#endif

/* Runs the scenario with the variables; a child that did not run or exit 0 is a failure. Under Wine a
 * child that failed with no output at all is run once more: Wine sometimes fails to start a process
 * (tests/run's run_wine has the cases; a clean-clone run on 2026-12-02 lost the "limit" child so,
 * which 25 runs of the program alone did not repeat); a failure of ours fails the second run too. */
static child *run(const char *scenario, const char *const *vars)
{
    static child c;
    run_child(scenario, vars, &c);
#ifdef _WIN32
    if (!c.ran && c.err[0] == 0) {
        fprintf(stderr, "  %s: the child failed with no output: run again\n", scenario);
        run_child(scenario, vars, &c);
    }
#endif
    CHECKF(c.ran, "%s: the child did not run or exit 0; it wrote:\n%s", scenario, c.err);
    return &c;
}

#define VARS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NO_VARS ((const char *const *)NULL)

/* The text is (or is not) in what the child wrote; the message shows all of it. */
#define CHECK_SAYS(c, text) CHECKF(strstr((c)->err, (text)) != NULL, "expected \"%s\" in:\n%s", (text), (c)->err)
#define CHECK_SILENT(c, text) CHECKF(strstr((c)->err, (text)) == NULL, "did not expect \"%s\" in:\n%s", (text), (c)->err)

/* The child's "child: cached A B" line. */
static void cached_counts(const child *c, int *a, int *b)
{
    const char *line = strstr(c->err, "child: cached ");
    *a = *b = -1;
    if (line == NULL || sscanf(line, "child: cached %d %d", a, b) != 2)
        *a = *b = -1;
}

/* Bytes of a figure of the statistics table ("512 B", "1.50 KB", "12.3 MB"). */
static double table_bytes(const char *text)
{
    double v = 0;
    char unit[4] = "";
    if (sscanf(text, " %lf %3s", &v, unit) != 2)
        return -1;
    double scale = strcmp(unit, "B") == 0 ? 1 : strcmp(unit, "KB") == 0 ? KB : strcmp(unit, "MB") == 0 ? MB
                 : strcmp(unit, "GB") == 0 ? 1024.0 * MB : -1;
    return v * scale;
}

/* ---- the tests ----------------------------------------------------------------------------------------- */

TEST(show_stats_prints_the_table_at_exit)
{
    child *c = run("stats", VARS("SHARDMM_SHOW_STATS=1"));
    if (TEST_NO_EXIT_HOOK) {
        CHECK_SILENT(c, "shardmm statistics");
        c = run("stats", VARS("SHARDMM_SHOW_STATS=1", "SHARDMM_VERBOSE=1"));
        CHECK_SAYS(c, "no exit hook here");
        return;
    }
    CHECK_SAYS(c, "shardmm statistics");
    CHECK_SAYS(c, "live blocks\n");
    CHECK_SAYS(c, "large-block cache\n");
    CHECK_SAYS(c, "operating system\n");
    size_t own = 0;
    const char *mine = strstr(c->err, "child: committed ");
    const char *table = strstr(c->err, "shardmm statistics");
    const char *row = table != NULL ? strstr(table, "\n  committed ") : NULL;
    CHECKF(mine != NULL && sscanf(mine, "child: committed %zu", &own) == 1, "no committed figure of the child:\n%s",
           c->err);
    CHECKF(row != NULL, "no committed row in:\n%s", c->err);
    if (row != NULL && own != 0) {
        double shown = table_bytes(row + strlen("\n  committed "));
        /* The child keeps a 3 MB block; at exit the figure is the child's own give or take what a
         * thread's exit gives back (Windows retires the main thread's heap before DLL_PROCESS_DETACH). */
        CHECKF(shown >= 3.0 * MB && shown <= 2.0 * own + MB, "committed at exit %.0f bytes, the child's own %zu",
               shown, own);
    }
    c = run("stats", NO_VARS);
    CHECK_SILENT(c, "shardmm statistics");
}

TEST(show_stats_with_an_invalid_value_stays_off)
{
    child *c = run("stats", VARS("SHARDMM_SHOW_STATS=yes"));
    CHECK_SILENT(c, "shardmm statistics");
    CHECK_SILENT(c, "SHARDMM_SHOW_STATS"); /* no warning without SHARDMM_VERBOSE */
    c = run("stats", VARS("SHARDMM_SHOW_STATS=yes", "SHARDMM_VERBOSE=1"));
    CHECK_SILENT(c, "shardmm statistics");
    CHECK_SAYS(c, "shardmm: SHARDMM_SHOW_STATS=yes: expected 0 or 1; the default stays\n");
}

TEST(report_leaks_writes_the_report_at_exit)
{
    child *c = run("leak", VARS("SHARDMM_REPORT_LEAKS=1"));
    if (TEST_NO_EXIT_HOOK) {
        CHECK_SILENT(c, " live block");
        c = run("leak", VARS("SHARDMM_REPORT_LEAKS=1", "SHARDMM_VERBOSE=1"));
        CHECK_SAYS(c, "no exit hook here");
        return;
    }
    CHECK_SAYS(c, "shardmm: ");
    CHECK_SAYS(c, " live block");
    c = run("leak", NO_VARS);
    CHECK_SILENT(c, " live block");
}

TEST(report_leaks_lists_the_leaked_blocks_text)
{
    if (TEST_NO_EXIT_HOOK)
        SKIP_TEST();
    child *c = run("leak", VARS("SHARDMM_REPORT_LEAKS=1"));
    CHECK_SAYS(c, "|" LEAKED_TEXT);
    CHECK_SAYS(c, "small blocks of 64 B: 1 block");
}

TEST(verbose_tells_a_commit_refused_by_the_limit)
{
    child *c = run("limit", VARS("SHARDMM_VERBOSE=1"));
    CHECK_SAYS(c, "child: limited malloc NULL");
    CHECK_SAYS(c, "shardmm: a commit of ");
    CHECK_SAYS(c, "(shard_set_limit)\n");
    c = run("limit", NO_VARS);
    CHECK_SAYS(c, "child: limited malloc NULL");
    CHECK_SILENT(c, "shardmm:");
}

TEST(verbose_tells_refusals_of_the_os)
{
    child *c = run("os-refusal", VARS("SHARDMM_VERBOSE=1"));
    CHECK_SAYS(c, "child: huge malloc NULL");
    CHECK_SAYS(c, "shardmm: the OS refused to commit ");
#ifndef _WIN32
    CHECK_SAYS(c, "child: 1 GB malloc under RLIMIT_AS NULL");
    CHECK_SAYS(c, "shardmm: the OS refused to reserve ");
#endif
    c = run("os-refusal", NO_VARS);
    CHECK_SAYS(c, "child: huge malloc NULL");
    CHECK_SILENT(c, "shardmm:");
}

TEST(verbose_tells_error_hook_calls)
{
    child *c = run("invalid-free", VARS("SHARDMM_VERBOSE=1"));
    CHECK_SAYS(c, "child: hook calls 1");
    CHECK_SAYS(c, "shardmm: invalid pointer passed to shard_free: 0x");
    CHECK_SAYS(c, "(to the error hook)\n");
    c = run("invalid-free", NO_VARS);
    CHECK_SAYS(c, "child: hook calls 1");
    CHECK_SILENT(c, "shardmm:");
}

TEST(verbose_warns_about_unknown_names_and_is_quiet_otherwise)
{
    child *c = run("cache-size", VARS("SHARDMM_VERBOSE=1", "SHARDMM_BOGUS=1"));
    CHECK_SAYS(c, "shardmm: unknown option SHARDMM_BOGUS, ignored\n");
    c = run("cache-size", VARS("SHARDMM_BOGUS=1"));
    CHECK_SILENT(c, "shardmm:");
    c = run("cache-delay", VARS("SHARDMM_VERBOSE=1")); /* nothing refused, no error, no unknown name */
    CHECK_SILENT(c, "shardmm:");
    CHECK_SAYS(c, "child: cached ");
}

TEST(delay_ms_0_empties_the_cache_at_the_next_large_block_call)
{
    int a, b;
    cached_counts(run("cache-delay", NO_VARS), &a, &b);
    CHECKF(a == 1 && b == 1, "by default the block stays cached for a second: %d, then %d", a, b);
    cached_counts(run("cache-delay", VARS("SHARDMM_DELAY_MS=0")), &a, &b);
    CHECKF(a == 1 && b == 0, "with no delay the block leaves at the next large-block call: %d, then %d", a, b);
    cached_counts(run("cache-delay", VARS("SHARDMM_DELAY_MS=60000")), &a, &b);
    CHECKF(a == 1 && b == 1, "with a minute the block stays: %d, then %d", a, b);
}

TEST(delay_ms_invalid_keeps_the_default)
{
    static const char *const invalid[] = {"SHARDMM_DELAY_MS=abc", "SHARDMM_DELAY_MS=", "SHARDMM_DELAY_MS=-1",
                                          "SHARDMM_DELAY_MS=1e3", "SHARDMM_DELAY_MS=4294967296"};
    for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++) {
        int a, b;
        child *c = run("cache-delay", VARS(invalid[i]));
        cached_counts(c, &a, &b);
        CHECKF(a == 1 && b == 1, "%s: the default delay keeps the block: %d, then %d", invalid[i], a, b);
        CHECK_SILENT(c, "shardmm:");
        c = run("cache-delay", VARS(invalid[i], "SHARDMM_VERBOSE=1"));
        char warning[128];
        snprintf(warning, sizeof warning, "shardmm: %s: expected a decimal number of milliseconds", invalid[i]);
        CHECK_SAYS(c, warning);
    }
}

TEST(large_cache_mb_sets_the_caches_limit)
{
    int a, b;
    cached_counts(run("cache-size", NO_VARS), &a, &b);
    CHECKF(a == 1 && b == 1, "by default both blocks are cached: %d, %d", a, b);
    cached_counts(run("cache-size", VARS("SHARDMM_LARGE_CACHE_MB=0")), &a, &b);
    CHECKF(a == 0 && b == 0, "with 0 MB nothing is cached: %d, %d", a, b);
    cached_counts(run("cache-size", VARS("SHARDMM_LARGE_CACHE_MB=4")), &a, &b);
    CHECKF(a == 0 && b == 1, "with 4 MB the 8 MB block is not cached, the 2 MB one is: %d, %d", a, b);
}

TEST(large_cache_mb_invalid_keeps_the_default)
{
    int a, b;
    child *c = run("cache-size", VARS("SHARDMM_LARGE_CACHE_MB=none", "SHARDMM_VERBOSE=1"));
    cached_counts(c, &a, &b);
    CHECKF(a == 1 && b == 1, "the default limit caches both blocks: %d, %d", a, b);
    CHECK_SAYS(c, "shardmm: SHARDMM_LARGE_CACHE_MB=none: expected a decimal number of megabytes");
    cached_counts(run("cache-size", VARS("SHARDMM_LARGE_CACHE_MB=99999999999")), &a, &b);
    CHECKF(a == 1 && b == 1, "a limit too large for the address space keeps the default: %d, %d", a, b);
}

TEST(large_spares_0_leaves_a_threads_freed_block_to_the_cache)
{
    child *c = run("spare", NO_VARS);
    CHECK_SAYS(c, "child: spare other"); /* by default it waits in the freeing thread's spare */
    c = run("spare", VARS("SHARDMM_LARGE_SPARES=0"));
    CHECK_SAYS(c, "child: spare same");
    c = run("spare", VARS("SHARDMM_DELAY_MS=0")); /* no wait for freed blocks: no spare either */
    CHECK_SAYS(c, "child: spare same");
    c = run("spare", VARS("SHARDMM_LARGE_SPARES=2", "SHARDMM_VERBOSE=1"));
    CHECK_SAYS(c, "shardmm: SHARDMM_LARGE_SPARES=2: expected 0 or 1");
    CHECK_SAYS(c, "child: spare other");
}

#ifndef _WIN32
/* A thread takes its spare back without a locked instruction only where the port fenced every thread at
 * start-up (large.c, spare_own); where membarrier is refused from the start, it uses the exchange, and
 * another thread's shard_collect takes the spare of a thread that waits either way. */
TEST(shard_collect_takes_a_waiting_threads_spare_with_or_without_membarrier)
{
    for (int refused = 0; refused < 2; refused++) {
        child *c = run("spare-unfenced", refused ? VARS("SHARD_TEST_NO_MEMBARRIER=1") : NO_VARS);
        if (refused && strstr(c->err, "child: no filter") != NULL)
            SKIP_TEST(); /* no seccomp filter here (a container's own may forbid it) */
        CHECK_SAYS(c, "child: cached 1 before, 0 after");
    }
}

TEST(options_come_from_proc_when_environ_is_cleared)
{
    int a, b;
    cached_counts(run("environ-cleared", VARS("SHARDMM_LARGE_CACHE_MB=0")), &a, &b);
    CHECKF(a == 0 && b == 0, "SHARDMM_LARGE_CACHE_MB=0 read from /proc/self/environ: %d, %d", a, b);
    cached_counts(run("environ-cleared", NO_VARS), &a, &b);
    CHECKF(a == 1 && b == 1, "by default both blocks are cached: %d, %d", a, b);
}

/* The child's "child: huge N KB in M segments, F fallbacks" line: N, M in *segments, F in *fallbacks
 * (huge pages the kernel could not find while the child ran, system-wide). */
static long huge_kb(const child *c, int *segments, long *fallbacks)
{
    const char *line = strstr(c->err, "child: huge ");
    long kb = -1;
    *segments = 0, *fallbacks = 0;
    if (line == NULL || sscanf(line, "child: huge %ld KB in %d segments, %ld fallbacks", &kb, segments, fallbacks) != 3)
        return -1;
    return kb;
}

/* The kernel's transparent huge page mode: "always", "madvise", "never" (or "" when unknown). */
static const char *thp_mode(void)
{
    static char mode[128];
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    mode[0] = 0;
    if (f == NULL)
        return "";
    if (fgets(mode, sizeof mode, f) == NULL)
        mode[0] = 0;
    fclose(f);
    return strstr(mode, "[always]") ? "always" : strstr(mode, "[madvise]") ? "madvise" : strstr(mode, "[never]") ? "never" : "";
}

/* Whether the kernel found no free 2 MB page for the child (memory fragmented): not ours to judge. */
#define SKIP_IF_NO_HUGE_PAGE(kb, fallbacks)                                                                 \
    do {                                                                                                    \
        if ((kb) < 2048 && (fallbacks) > 0)                                                                 \
            SKIP_TEST();                                                                                    \
    } while (0)

TEST(huge_pages_go_under_a_heap_grown_past_2_mb_and_not_under_a_small_one)
{
    int segments;
    long fallbacks;
    /* With THP "always" the kernel gives huge pages to whatever it likes, asked or not: "none" is
     * checked only under "madvise"; with "never" (or no THP) it gives none at all. */
    int asked_only = strcmp(thp_mode(), "madvise") == 0;
    if (!asked_only && strcmp(thp_mode(), "always") != 0)
        SKIP_TEST();
    long small = huge_kb(run("huge-pages-small", NO_VARS), &segments, &fallbacks);
    CHECKF(small == 0 || (!asked_only && small > 0),
           "by default a heap of 1 MB of small blocks has no huge page: %ld KB in %d segments", small, segments);
    long none = huge_kb(run("huge-pages", VARS("SHARDMM_HUGE_PAGES=0")), &segments, &fallbacks);
    CHECKF(none == 0 || (!asked_only && none > 0), "SHARDMM_HUGE_PAGES=0: none under 16 MB: %ld KB", none);
    child *c = run("huge-pages", VARS("SHARDMM_HUGE_PAGES=3", "SHARDMM_VERBOSE=1"));
    CHECK_SAYS(c, "shardmm: SHARDMM_HUGE_PAGES=3: expected 0, 1 or 2");
    long kb = huge_kb(c, &segments, &fallbacks);
    SKIP_IF_NO_HUGE_PAGE(kb, fallbacks);
    /* 16 MB is four segments: the three after the first are hinted whole (the first's units when filled). */
    CHECKF(kb >= 2048 && segments >= 4,
           "by default (and with an invalid value) a heap grown to 16 MB holds huge pages: %ld KB in %d "
           "segments (%ld fallbacks)", kb, segments, fallbacks);
    kb = huge_kb(run("huge-pages-small", VARS("SHARDMM_HUGE_PAGES=2")), &segments, &fallbacks);
    SKIP_IF_NO_HUGE_PAGE(kb, fallbacks);
    CHECKF(kb >= 2048, "SHARDMM_HUGE_PAGES=2 puts even a 1 MB heap on a huge page: %ld KB (%ld fallbacks)", kb,
           fallbacks);
}

/* The line of two_heaps for `what` in c's output: 1 when it was there and neither heap lost a block (-1),
 * with what the heaps of 8 and 3 medium blocks returned and the fallbacks; else 0 and all -1. */
static int two_heaps_read(const child *c, const char *what, long *quarter, long *few, unsigned long *fallbacks)
{
    char prefix[64], format[128];
    snprintf(prefix, sizeof prefix, "child: %s ", what);
    snprintf(format, sizeof format, "%s%%ld KB with 8 blocks, %%ld KB with 3, %%lu fallbacks", prefix);
    const char *line = strstr(c->err, prefix);
    *quarter = *few = -1;
    *fallbacks = 0;
    if (line == NULL || sscanf(line, format, quarter, few, fallbacks) != 3)
        *quarter = *few = -1;
    return *quarter != -1 && *few != -1;
}

/* scenario_huge_pages_spared_both: the arena of a heap with a quarter of its medium unit committed goes
 * on huge pages with its small unit; one with less stays on small pages. */
TEST(a_heap_that_fills_one_spared_unit_puts_the_other_on_huge_pages_when_it_used_a_quarter)
{
    if (strcmp(thp_mode(), "madvise") != 0 && strcmp(thp_mode(), "always") != 0)
        SKIP_TEST();
    child *c = run("huge-pages-spared-both", NO_VARS);
    long quarter, few;
    unsigned long fallbacks;
    CHECKF(two_heaps_read(c, "arena", &quarter, &few, &fallbacks), "the blocks of both heaps kept their "
           "patterns: %s", c->err);
    CHECKF(quarter >= 0, "the arena of a heap that filled its small spared unit with 4 of 8 medium commits is "
           "hinted for huge pages (%ld)", quarter);
    CHECKF(few == -2, "the arena of a heap with 1 medium commit is not hinted (%ld KB of huge pages)", few);
}

/* scenario_huge_pages_upper: the upper 2 MB of a heap's first segment follows the lower one. Its lower
 * 2 MB full (collapsed: the process's first collapse, made whatever it costs) and the upper half used,
 * the upper unit is hinted. Where the collapse fails (a filter makes MADV_COLLAPSE say EINVAL), the
 * upper unit stays on small pages, neither hinted nor on a huge page, until it fills in turn (with THP
 * "madvise": under "always" the kernel takes what it likes). Until 2026-12-04 it was hinted from the
 * start, and took a huge page at its first touch, whatever became of the lower one. */
TEST(the_upper_2_mb_of_a_heap_s_first_segment_follows_the_lower_onto_huge_pages)
{
    if (strcmp(thp_mode(), "madvise") != 0)
        SKIP_TEST();
    for (int refused = 0; refused < 2; refused++) {
        child *c = run("huge-pages-upper", refused ? VARS("SHARD_TEST_NO_COLLAPSE=1") : NO_VARS);
        if (refused && strstr(c->err, "child: no filter") != NULL)
            SKIP_TEST(); /* no seccomp filter here (a container's own may forbid it) */
        unsigned long kb = 1;
        int hinted = -1;
        size_t bad = 1;
        const char *line = strstr(c->err, "child: upper unit ");
        int parsed = line != NULL && sscanf(line, "child: upper unit %lu KB hinted %d, %zu bad words", &kb,
                                            &hinted, &bad) == 3;
        CHECKF(parsed && bad == 0, "the blocks of a heap of 3 MB kept their patterns: %s", c->err);
        if (refused)
            CHECKF(kb == 0 && hinted == 0, "with no collapse, the half-used upper 2 MB of a heap's first segment: "
                   "%lu KB of huge pages, hinted %d (0 and 0 expected)", kb, hinted);
        else if (kernel_collapses())
            CHECKF(hinted == 1, "after its lower 2 MB's collapse, the upper 2 MB of a heap's first segment is "
                   "hinted (%lu KB of huge pages)", kb);
    }
}

/* scenario_huge_pages_upper_early: a heap that reaches the upper 2 MB of its first segment with a quarter
 * of its arena's spared unit used is not a small one (segment.h: segment_spared_upper_early), and its
 * upper unit is hinted at its first commit, before anything there is touched, though its lower one is
 * far from full; one with a single medium commit keeps its upper unit spared. On the old code, where
 * the upper unit waited for the lower one's collapse, the first was not hinted either (-2). */
TEST(a_heap_with_medium_memory_hints_its_first_segment_s_upper_2_mb_at_its_first_commit)
{
    if (strcmp(thp_mode(), "madvise") != 0)
        SKIP_TEST();
    child *c = run("huge-pages-upper-early", NO_VARS);
    long quarter, few;
    unsigned long fallbacks;
    CHECKF(two_heaps_read(c, "upper unit", &quarter, &few, &fallbacks), "the blocks of both heaps kept their "
           "patterns and reached the upper 2 MB: %s", c->err);
    CHECKF(quarter >= 0, "the upper 2 MB of a heap with 4 of its arena's 8 spared commits made is hinted at its "
           "first commit (%ld)", quarter);
    CHECKF(quarter >= 2048 || fallbacks > 0, "and took a huge page at its first touch: %ld KB", quarter);
    CHECKF(few == -2, "the upper 2 MB of a heap with 1 medium commit is not hinted (%ld KB of huge pages)", few);
}

/* scenario_huge_pages_sparse: a heap that committed every page of its first segment's lower 2 MB, but
 * touched a tenth of it, keeps it on small pages: a huge page there would make 2 MB resident for the
 * 200 KB it uses. Until 2026-12-04 the unit went on huge pages when its pages were all committed (the
 * process's first collapse, made whatever it costs): 2048 KB, and the upper unit was hinted after it. */
TEST(a_heap_that_commits_its_spared_2_mb_but_touches_little_of_it_stays_on_small_pages)
{
    if (strcmp(thp_mode(), "madvise") != 0)
        SKIP_TEST();
    child *c = run("huge-pages-sparse", NO_VARS);
    unsigned long kb = 1;
    int hinted = -1, past = 0;
    size_t bad = 1;
    const char *line = strstr(c->err, "child: lower unit ");
    int parsed = line != NULL && sscanf(line, "child: lower unit %lu KB hinted %d, past it %d, %zu bad bytes", &kb,
                                        &hinted, &past, &bad) == 4;
    CHECKF(parsed && bad == 0, "one block of each class kept its pattern: %s", c->err);
    CHECKF(past, "36 classes take the lower 2 MB's 31 pages and more: %s", c->err);
    CHECKF(kb == 0 && hinted == 0, "a lower 2 MB committed whole but touched little: %lu KB of huge pages, "
           "hinted %d (0 and 0 expected)", kb, hinted);
}

/* scenario_huge_pages_recarved: what a heap carves again in pages it used before counts once, so a heap
 * of 700 KB whose blocks change class round after round stays on small pages (a first version of the
 * count by carving took bench/run's maps@1, a heap of 3 MB, to huge pages and twice its peak). */
TEST(a_heap_that_carves_the_same_pages_again_does_not_count_them_twice)
{
    if (strcmp(thp_mode(), "madvise") != 0)
        SKIP_TEST();
    child *c = run("huge-pages-recarved", NO_VARS);
    unsigned long kb = 1;
    int hinted = -1;
    size_t bad = 1;
    const char *line = strstr(c->err, "child: lower unit ");
    int parsed = line != NULL &&
                 sscanf(line, "child: lower unit %lu KB hinted %d, %zu bad words", &kb, &hinted, &bad) == 3;
    CHECKF(parsed && bad == 0, "the blocks of every round kept their patterns: %s", c->err);
    CHECKF(kb == 0 && hinted == 0, "a lower 2 MB carved 2.5 MB over 700 KB: %lu KB of huge pages, hinted %d "
           "(0 and 0 expected)", kb, hinted);
}

/* scenario_huge_pages_outgrown: a heap that needs a second segment has outgrown its first, touched or not
 * (alloc-test and the mixed churn commit segments long before they touch them, and take the rest of
 * them soon after): its first segment goes on huge pages then (the hint; the collapse is the port's to
 * weigh). */
TEST(a_heap_that_makes_a_second_segment_puts_its_sparse_first_on_huge_pages)
{
    if (strcmp(thp_mode(), "madvise") != 0)
        SKIP_TEST();
    child *c = run("huge-pages-outgrown", NO_VARS);
    int hinted = 0, second = 0;
    size_t bad = 1;
    const char *line = strstr(c->err, "child: lower unit ");
    int parsed = line != NULL && sscanf(line, "child: lower unit hinted %d, second segment %d, %zu bad", &hinted,
                                        &second, &bad) == 3;
    CHECKF(parsed && bad == 0 && second, "the blocks of a heap of two segments kept their patterns: %s", c->err);
    CHECKF(hinted, "a first segment committed whole with half of it touched has the huge-page hint once its heap "
           "makes a second (%d)", hinted);
}

/* A page filling up in a spared unit (on 4 KB pages: segment.h) has its OS pages made resident ahead of
 * the carve's links, a few calls a page rather than a fault each OS page (small.c: carve_reach), and
 * no more than twice what its items reach: 4 of its 16 when its items reach 3, all of them when they
 * reach 9. On the old code each page became resident at its fault: 3 and 9. Not under THP "always",
 * where the kernel puts a huge page under the first touch of the segment, which is committed whole. */
TEST(a_page_filling_in_a_spared_unit_is_made_resident_ahead_of_its_items)
{
    if (strcmp(thp_mode(), "always") == 0)
        SKIP_TEST();
    child *c = run("carve-resident", NO_VARS);
    long third = 0, ninth = 0;
    size_t bad = 1;
    const char *line = strstr(c->err, "child: resident ");
    int parsed = line != NULL && sscanf(line, "child: resident %ld at the third OS page, %ld at the ninth, %zu bad "
                                              "bytes", &third, &ninth, &bad) == 3;
    CHECKF(parsed && bad == 0, "the 1 KB blocks of a fresh page kept their contents: %s", c->err);
    CHECKF(third >= 4 && third <= 6, "OS pages resident when the items reach 3 of them: %ld (4 expected: 3 and "
           "ahead, at most twice)", third);
    CHECKF(ninth == 16, "OS pages resident when the items reach 9 of them: %ld (all 16 expected)", ninth);
}

/* A page's carves grow with it: the first links 4 KB of items (4 of 1 KB), each later one as many items
 * again as the page has carved (small.c: page_carve). So a page used for a few items holds at most
 * twice what they reach, and one that fills takes its slow path 5 times, not 16: with 1 KB items its
 * OS pages resident when its items reach 1, 2, 3, 5 and 9 of them are 1, 2, 4, 8 and 16. On the old code
 * (4 KB a carve) they were 1, 2, 3, 5 and 9. Not under THP "always", where the kernel may put a huge
 * page under the segment's first touch. */
TEST(a_page_carves_as_many_items_again_as_it_has_carved)
{
    if (strcmp(thp_mode(), "always") == 0)
        SKIP_TEST();
    child *c = run("carve-batches", VARS("SHARDMM_HUGE_PAGES=0"));
    long r[5] = {0, 0, 0, 0, 0};
    size_t bad = 1;
    const char *line = strstr(c->err, "child: resident ");
    int parsed = line != NULL && sscanf(line, "child: resident %ld %ld %ld %ld %ld, %zu bad bytes", &r[0], &r[1],
                                        &r[2], &r[3], &r[4], &bad) == 6;
    CHECKF(parsed && bad == 0, "the 1 KB blocks of a fresh page kept their contents: %s", c->err);
    CHECKF(r[0] == 1 && r[1] == 2 && r[2] == 4 && r[3] == 8 && r[4] == 16,
           "OS pages resident when the items reach 1, 2, 3, 5, 9 of them: %ld %ld %ld %ld %ld (1 2 4 8 16 "
           "expected)", r[0], r[1], r[2], r[3], r[4]);
}

TEST(a_heap_that_fills_its_spared_first_2_mb_gets_huge_pages_there_with_its_blocks_intact)
{
    if (strcmp(thp_mode(), "madvise") != 0 && strcmp(thp_mode(), "always") != 0)
        SKIP_TEST();
    child *c = run("huge-pages-spared", NO_VARS);
    unsigned long small = 0, medium = 0, fallbacks = 0;
    int hinted = 0;
    size_t bad = 1;
    const char *line = strstr(c->err, "child: spared ");
    int parsed = line != NULL && sscanf(line, "child: spared small %lu KB, medium %lu KB hinted %d, %zu bad words, "
                                              "%lu fallbacks", &small, &medium, &hinted, &bad, &fallbacks) == 5;
    CHECKF(parsed && bad == 0, "the blocks of the spared units after their collapse: %s", c->err);
    CHECKF(hinted, "the spared unit of an arena with 576 KB committed is hinted for huge pages (%lu KB of them)",
           medium);
    if (!kernel_collapses() || (fallbacks > 0 && small < 2048))
        SKIP_TEST(); /* no collapse here, or no huge page free */
    CHECKF(small >= 2048, "a heap that committed its first segment's spared 2 MB: %lu KB of huge pages there "
           "(2048 expected)", small);
}
#endif
