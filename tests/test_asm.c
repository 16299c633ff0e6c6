/* test_asm.c - checkasm-style tests of the NASM fast paths (asm/fast.asm) against their C twins.
 *
 * The program links the library's objects, so the hidden C twins api_malloc_c, api_free_c and
 * api_realloc_c (src/api.c built with SHARD_ASM=1) are reachable beside the NASM entry points
 * shard_malloc, shard_free and shard_realloc, and so are the internal structures (src/heap.h).
 *
 * 1. Same sequences, compared field by field. Thread A runs a seeded pseudo-random sequence of
 *    operations through the NASM entries, thread B the identical sequence through the C twins, each on a
 *    fresh heap of its own: A runs first and stays alive (a heap of an exited thread would be taken,
 *    warm, by the next thread), then B. No thread of this program ever exits with a heap; every helper
 *    thread parks until the process ends. Both heaps start empty and the allocator is deterministic
 *    per heap, so every result must agree: its offset in its 4 MB segment, its kind, for small blocks
 *    the ordinal of its segment in the heap, its usable size, and the number of error-hook calls. At
 *    checkpoints and at the end every page descriptor of every small segment of both heaps, the free
 *    and local_free lists (as offsets in the segment) and the heap's lists, counts and page-per-size
 *    array must agree too. One thing is not per heap: the clock. Free pages beyond
 *    SHARD_KEEP_FREE_PAGES, and empty arenas beyond one, are decommitted once free for a second; so
 *    when a call leaves a heap there, both threads call shard_collect(), which decommits them at once
 *    (keep_deterministic). The blocks of every size are at the same offsets in both heaps (large ones
 *    at 32 in their 4 MB, whatever the process's cache of large blocks held).
 * 2. Register preservation: every call of the sequences, and of the other tests, goes through
 *    tests/callcheck.asm, which puts random values in the callee-saved registers (rdi, rsi and
 *    xmm6-xmm15 too on Win64) and garbage in the free volatile ones, and reports what changed.
 * 3. Paths: callcheck_trace2 single-steps a call (the trap flag; a SIGTRAP handler on Linux, a vectored
 *    exception handler on Windows) and counts the instructions until the `ret` or until the entry of a
 *    C slow path. From the heap state before a call, the test predicts by the contract of src/fast.h
 *    whether the fast path applies; the NASM function must then return after exactly the instruction
 *    count that asm/fast.asm states (+4 on Windows for the TLS slot tests), or else reach the slow
 *    path. Without this, a fast case sent to the slow path would go unseen: the slow paths give the
 *    same answers.
 *
 * Per heap: the thread heaps' free small pages are lent to no other heap here (options_values.lend_pages
 * 0, set before the first allocation; src/small.h, lent pages), or thread B would take pages thread A
 * emptied, at other offsets than A's own.
 *
 * Seeds: SHARD_ASM_SEED=n in the environment replaces the default seed of the long sequence; every
 * failure message names the seed and the operation.
 *
 * Build: see build.ninja (build/test-asm, build/debug/test-asm, build/win64/test-asm.exe, and
 * build/win64/test-asm-tls64.exe: with -DTEST_TLS_HIGH, the allocator's TLS index is 64 or above).
 * Run:   build/test-asm [test names]
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef _WIN32
#include <signal.h>
#include <ucontext.h>
#endif

#include "shardmm.h"
#include "../src/fast.h"
#include "../src/heap.h"
#include "../src/options.h"

/* Each heap its own pages (see the top): before the first allocation, which reads the environment's
 * options (those set there only), so this stays. */
__attribute__((constructor)) static void lend_no_pages(void) { options_values.lend_pages = 0; }

/* ---- random numbers ------------------------------------------------------------------------------ */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t next64(rng *r)
{
    r->s += 0x9e3779b97f4a7c15ull;
    return harness_mix64(r->s);
}

/* Uniform in 0 .. n-1 (n > 0; the bias of the modulo does not matter here). */
static size_t below(rng *r, size_t n) { return (size_t)(next64(r) % n); }

/* ---- the checked call (tests/callcheck.asm) ------------------------------------------------------ */

/* callcheck_values[]: 0..7 rbx rbp r12 r13 r14 r15 rdi rsi, 8 + 2k and 9 + 2k xmm(6 + k), 28..34 garbage for
 * rax rcx rdx r8 r9 r10 r11. The mask of what changed has bit i for value i (bit 8 + k for xmm(6 + k)),
 * bit 20 for rsp and bit 21 for the direction flag. */
#define CC_VALUES 35
#define CC_BIT_RSP ((uint64_t)1 << 20)
#define CC_BIT_DF ((uint64_t)1 << 21)
#ifdef _WIN32
#define CC_CHECKED ((uint64_t)0x3ffff | CC_BIT_RSP | CC_BIT_DF) /* rbx .. rsi, xmm6 .. xmm15, rsp, DF */
#define SLOT_TEST_INSTRUCTIONS 4               /* the TLS index's test and the slot's NULL test */
#else
#define CC_CHECKED ((uint64_t)0x3f | CC_BIT_RSP | CC_BIT_DF)
#define SLOT_TEST_INSTRUCTIONS 0
#endif

uint64_t callcheck_values[CC_VALUES];
uint64_t callcheck_call2(void *fn, uint64_t a0, uint64_t a1, uint64_t *clobbered);
uint64_t callcheck_trace2(void *fn, uint64_t a0, uint64_t a1, uint64_t *clobbered);
void callcheck_clobber(uint64_t which);
extern char callcheck_trace_return[];

static const char *const cc_names[22] = {"rbx", "rbp", "r12", "r13", "r14", "r15", "rdi", "rsi",
                                         "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",
                                         "xmm14", "xmm15", "-", "-", "rsp", "DF"};

static rng cc_rng = {0x5eed0fca11c4ecull};

static void cc_refill(void)
{
    for (int i = 0; i < CC_VALUES; i++)
        callcheck_values[i] = next64(&cc_rng);
}

static void cc_report(uint64_t mask, const char *what)
{
    char names[256] = "";
    for (int b = 0; b < 22; b++)
        if ((mask >> b) & 1) {
            strcat(names, " ");
            strcat(names, cc_names[b]);
        }
    harness_fail(__FILE__, __LINE__, "%s: the call changed%s (mask 0x%llx)", what, names, (unsigned long long)mask);
}

/* fn(a0, a1) with random values in the preserved registers; any change is a failure. */
static uint64_t checked_call(void *fn, uint64_t a0, uint64_t a1, const char *what)
{
    uint64_t mask = UINT64_MAX;
    cc_refill();
    uint64_t r = callcheck_call2(fn, a0, a1, &mask);
    if (mask != 0)
        cc_report(mask, what);
    return r;
}

/* ---- single-stepping ----------------------------------------------------------------------------- */

/* The C slow paths the fast paths jump to (src/fast.h); 0 is none. */
enum { SLOW_NONE, SLOW_MALLOC, SLOW_MALLOC_DRY, SLOW_FREE, SLOW_FREE_OWN_PAGE, SLOW_REALLOC, SLOW_ENTRIES };
static const char *const slow_names[SLOW_ENTRIES] = {"none", "api_malloc_slow", "api_malloc_dry", "api_free_slow",
                                                      "small_free_local_slow", "api_realloc_slow"};

static volatile long trace_steps;
static volatile long trace_slow_at; /* the step at which a slow path's entry was reached; 0: never */
static volatile int trace_slow;     /* which one */
static uintptr_t trace_slow_entry[SLOW_ENTRIES];

/* One trap: 1 when single-stepping ends here (fn returned, or a slow path begins). */
static int trace_step(uintptr_t ip)
{
    trace_steps++;
    if (ip == (uintptr_t)callcheck_trace_return)
        return 1;
    for (int i = 1; i < SLOW_ENTRIES; i++)
        if (ip == trace_slow_entry[i]) {
            trace_slow_at = trace_steps;
            trace_slow = i;
            return 1;
        }
    return 0;
}

#ifdef _WIN32
static LONG WINAPI on_single_step(EXCEPTION_POINTERS *e)
{
    if (e->ExceptionRecord->ExceptionCode != EXCEPTION_SINGLE_STEP)
        return EXCEPTION_CONTINUE_SEARCH;
    if (trace_step((uintptr_t)e->ContextRecord->Rip))
        e->ContextRecord->EFlags &= ~0x100u;
    else
        e->ContextRecord->EFlags |= 0x100u;
    return EXCEPTION_CONTINUE_EXECUTION;
}
#else
static void on_single_step(int sig, siginfo_t *info, void *context)
{
    (void)sig;
    (void)info;
    ucontext_t *uc = (ucontext_t *)context;
    if (trace_step((uintptr_t)uc->uc_mcontext.gregs[REG_RIP]))
        uc->uc_mcontext.gregs[REG_EFL] &= ~0x100;
    else
        uc->uc_mcontext.gregs[REG_EFL] |= 0x100;
}
#endif

static void trace_setup(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    trace_slow_entry[SLOW_MALLOC] = (uintptr_t)(void *)api_malloc_slow;
    trace_slow_entry[SLOW_MALLOC_DRY] = (uintptr_t)(void *)api_malloc_dry;
    trace_slow_entry[SLOW_FREE] = (uintptr_t)(void *)api_free_slow;
    trace_slow_entry[SLOW_FREE_OWN_PAGE] = (uintptr_t)(void *)small_free_local_slow;
    trace_slow_entry[SLOW_REALLOC] = (uintptr_t)(void *)api_realloc_slow;
#ifdef _WIN32
    AddVectoredExceptionHandler(1, on_single_step);
#else
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_single_step;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTRAP, &sa, NULL);
#endif
}

typedef struct path {
    long instructions; /* executed by fn before its `ret` (included) or before the slow path's entry */
    int slow;          /* the slow path whose entry was reached, SLOW_NONE if fn returned */
} path;

/* checked_call, single-stepped. One thread at a time. */
static uint64_t traced_call(void *fn, uint64_t a0, uint64_t a1, const char *what, path *out)
{
    uint64_t mask = UINT64_MAX;
    trace_setup();
    cc_refill();
    trace_steps = 0;
    trace_slow_at = 0;
    trace_slow = SLOW_NONE;
    uint64_t r = callcheck_trace2(fn, a0, a1, &mask);
    if (mask != 0)
        cc_report(mask, what);
    out->slow = trace_slow;
    out->instructions = (out->slow ? trace_slow_at : trace_steps) - 1; /* the first trap is the call's */
    return r;
}

/* ---- the entries, the error hook, the heap ------------------------------------------------------- */

enum { OP_MALLOC = 1, OP_FREE = 2, OP_REALLOC = 3 };
static const char *const op_names[] = {"?", "malloc", "free", "realloc"};

typedef struct entries {
    const char *name;
    void *fn[4]; /* by OP_* */
} entries;

static entries asm_entries, c_entries;

static void entries_setup(void)
{
    asm_entries.name = "asm";
    asm_entries.fn[OP_MALLOC] = (void *)shard_malloc;
    asm_entries.fn[OP_FREE] = (void *)shard_free;
    asm_entries.fn[OP_REALLOC] = (void *)shard_realloc;
    c_entries.name = "C";
    c_entries.fn[OP_MALLOC] = (void *)api_malloc_c;
    c_entries.fn[OP_FREE] = (void *)api_free_c;
    c_entries.fn[OP_REALLOC] = (void *)api_realloc_c;
}

/* The fast paths' instruction counts on Linux, `ret` included, as asm/fast.asm states them; change
 * them together. malloc above 2 KB adds the class table (7), a malloc that takes the page's local_free
 * list because its free list is dry adds that test and the swap (5). A free that empties the only page
 * of its class takes the ordinary path (that page counts one more in `used`, src/small.c). */
enum { FAST_MALLOC = 15, FAST_MALLOC_CLASS = 22, FAST_MALLOC_LOCAL = 5, FAST_FREE = 22, FAST_REALLOC = 24,
       FAST_FREE_GATHERED = 33 };
/* The hardened build (SHARD_HARDENED) adds to malloc the decoding of the next link and its test (10 when
 * it is the end of the list, 11 when it leads to an item: the item test), 1 more when local_free is
 * taken; to free the double-free test and the encoding (10), and the head's link (6 when it ends the
 * list, 4 when it leads on); to realloc the double-free test (6). */
#if SHARD_HARDENED
enum { HARD_MALLOC_END = 10, HARD_MALLOC_ITEM = 11, HARD_MALLOC_LOCAL = 1, HARD_FREE = 10, HARD_FREE_HEAD_END = 6,
       HARD_FREE_HEAD_ITEM = 4, HARD_REALLOC = 6 };
#endif

#ifdef _WIN32
extern uintptr_t port_win64_slot_offset;
#endif
/* With a TLS index of 64 or above (TEST_TLS_HIGH) the NASM entries take the slow path for every call. */
#ifdef TEST_TLS_HIGH
#define ALWAYS_SLOW 1
#else
#define ALWAYS_SLOW 0
#endif

/* The calling thread's heap, NULL without one. */
static heap *my_heap(void) { return heap_mine(); }

/* What the contract (src/fast.h) says a call does, from the heap state as it is: the fast path
 * (`instructions` of it) or a jump to the slow path `slow`. */
typedef struct expectation {
    int slow;
    long instructions;
} expectation;

static expectation contract(int op, const void *p, size_t size)
{
    expectation e = {op == OP_MALLOC ? SLOW_MALLOC : op == OP_FREE ? SLOW_FREE : SLOW_REALLOC, 0};
    heap *h = my_heap();
#ifdef _WIN32
    if (port_win64_slot_offset == 0) /* an index of 64 or above: the slot is read on the slow path */
        return e;
#endif
    if (h == NULL)
        return e; /* Linux: heap_none, which has no page with items and owns no segment */
    if (op == OP_MALLOC) {
        const page *pg;
        if (size <= SHARD_DIRECT_MAX)
            pg = h->direct[(size + 15) >> 4];
        else if (size <= SHARD_SMALL_MAX)
            pg = h->classes[class_by_size16[(size + 15) >> 4]].first;
        else
            return e;
        if (pg != NULL && (pg->free != NULL || pg->local_free != NULL))
            e.slow = SLOW_NONE;
        else if (pg != NULL && pg != &small_empty_page)
            e.slow = SLOW_MALLOC_DRY; /* a page of the class, but no item in it */
        e.instructions = (size <= SHARD_DIRECT_MAX ? FAST_MALLOC : FAST_MALLOC_CLASS) +
                         (pg != NULL && pg->free == NULL ? FAST_MALLOC_LOCAL : 0);
#if SHARD_HARDENED
        if (pg != NULL && e.slow == SLOW_NONE) {
            block *b = pg->free != NULL ? pg->free : pg->local_free;
            block *n = link_get(b);
            e.instructions += (n == NULL ? HARD_MALLOC_END : HARD_MALLOC_ITEM) +
                              (pg->free == NULL ? HARD_MALLOC_LOCAL : 0);
            if (!link_fits(pg, b, n))
                e.slow = SLOW_MALLOC;
        }
#endif
    } else {
        uintptr_t a = (uintptr_t)p, seg = a & ~(uintptr_t)SEGMENT_MASK;
        if (h->own[(uint32_t)a >> SEGMENT_SHIFT] != seg) {
#if !SHARD_HARDENED
            /* Another heap's block in the page whose frees h gathers: onto the list, unless it would be
             * the list's last (small.c, gathered frees). */
            const page *gp = h->gather_page;
            if (op == OP_FREE && gp != NULL && page_of(p) == gp && small_valid_foreign(gp, p) &&
                h->gather_count + 1 < SHARD_GATHER_ITEMS) {
                e.slow = SLOW_NONE;
                e.instructions = FAST_FREE_GATHERED + SLOT_TEST_INSTRUCTIONS;
            }
#endif
            return e;
        }
        const page *pg = page_of(p);
        uint64_t off = a & 0xffff;
        int item = (uint32_t)off * pg->item_mul < pg->item_bound;
        if (op == OP_FREE) {
            /* Fast: the page keeps items out after the free, or it empties and is its class's only
             * page (judged by the list, not by `sole`: a wrong `sole` shows as a path mismatch). */
            const page_list *l = &h->classes[pg->cls];
            int alone = l->first == pg && l->last == pg;
            long left = (long)pg->used - pg->sole - 1;
            e.slow = item && (left > 0 || (left == 0 && alone)) ? SLOW_NONE : SLOW_FREE_OWN_PAGE;
            e.instructions = FAST_FREE;
#if SHARD_HARDENED
            /* Not an item (page 0's descriptor is the segment header): slow before these steps. */
            block *head = item ? pg->free : NULL;
            if (item && small_looks_free(pg, p))
                e.slow = SLOW_FREE_OWN_PAGE;
            if (head != NULL && !link_fits(pg, head, link_get(head)))
                e.slow = SLOW_FREE_OWN_PAGE;
            e.instructions += HARD_FREE + (head == NULL ? 0 : link_get(head) == NULL ? HARD_FREE_HEAD_END
                                                                                   : HARD_FREE_HEAD_ITEM);
#endif
        } else {
            if (size <= pg->block_size && size >= (pg->block_size >> 2) && item && !small_looks_free(pg, p))
                e.slow = SLOW_NONE;
            e.instructions = FAST_REALLOC;
#if SHARD_HARDENED
            e.instructions += HARD_REALLOC;
#endif
        }
    }
    e.instructions = e.slow == SLOW_NONE ? e.instructions + SLOT_TEST_INSTRUCTIONS : 0;
    return e;
}

/* Whether the call went as expected; if not, why[] says how. */
static int path_as_expected(const expectation *e, const path *t, char *why, size_t size)
{
    if (t->slow == e->slow && (e->slow != SLOW_NONE || t->instructions == e->instructions))
        return 1;
    char got[96], want[96];
    if (t->slow == SLOW_NONE)
        snprintf(got, sizeof got, "returned after %ld instructions", t->instructions);
    else
        snprintf(got, sizeof got, "went to %s after %ld instructions", slow_names[t->slow], t->instructions);
    if (e->slow == SLOW_NONE)
        snprintf(want, sizeof want, "the fast path of %ld", e->instructions);
    else
        snprintf(want, sizeof want, "%s", slow_names[e->slow]);
    snprintf(why, size, "%s; the contract says %s", got, want);
    return 0;
}

static struct {
    int calls;
    int error;
    void *ptr;
} hook_seen;

static void recording_hook(void *arg, int error, void *ptr)
{
    (void)arg;
    __atomic_add_fetch(&hook_seen.calls, 1, __ATOMIC_SEQ_CST);
    hook_seen.error = error;
    hook_seen.ptr = ptr;
}

__attribute__((constructor)) static void setup(void)
{
#ifdef TEST_TLS_HIGH
    /* Windows, built with -DTEST_TLS_HIGH: 70 TLS indexes taken before the allocator takes its own (at
     * its first allocation), so its index is 64 or above and every NASM entry goes to the slow path,
     * which reads the slot through the TEB's expansion array; contract() expects exactly that. */
    for (int i = 0; i < 70; i++)
        if (TlsAlloc() == TLS_OUT_OF_INDEXES)
            break;
#endif
    entries_setup();
    shard_set_error_hook(recording_hook, NULL);
}

static int hook_calls(void) { return __atomic_load_n(&hook_seen.calls, __ATOMIC_SEQ_CST); }

/* The ordinal of small segment seg in h, the oldest 0; 0xfe if h does not have it. */
static unsigned segment_ordinal(const heap *h, uintptr_t seg)
{
    unsigned n = 0, at = 0xffff;
    for (const segment *s = h ? h->segments : NULL; s != NULL; s = s->next, n++)
        if ((uintptr_t)s == seg)
            at = n;
    return at == 0xffff ? 0xfe : n - 1 - at;
}

/* ---- helper threads that never exit -------------------------------------------------------------- */

static void park_forever(void)
{
    for (;;)
        sleep_ms(1000);
}

static void wait_flag(volatile int *flag)
{
    while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE))
        sleep_ms(1);
}

static void set_flag(volatile int *flag) { __atomic_store_n(flag, 1, __ATOMIC_RELEASE); }

/* Runs fn(arg) in a new thread that parks afterwards (so its heap never goes to the stack of free
 * heaps), and waits until fn has returned. */
typedef struct parked {
    void (*fn)(void *);
    void *arg;
    volatile int done;
} parked;

static void *parked_entry(void *p)
{
    parked *t = (parked *)p;
    t->fn(t->arg);
    set_flag(&t->done);
    park_forever();
    return NULL;
}

static void run_parked(void (*fn)(void *), void *arg)
{
    parked *t = (parked *)calloc(1, sizeof *t); /* the thread keeps it */
    thread_t th;
    t->fn = fn;
    t->arg = arg;
    if (thread_start(&th, parked_entry, t) != 0) {
        harness_fail(__FILE__, __LINE__, "thread_start failed");
        return;
    }
    wait_flag(&t->done);
}

static double seconds_now(void)
{
#ifdef _WIN32
    LARGE_INTEGER f, c;
    QueryPerformanceFrequency(&f);
    QueryPerformanceCounter(&c);
    return (double)c.QuadPart / (double)f.QuadPart;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
#endif
}

/* ---- snapshots of a heap's small pages ----------------------------------------------------------- */

/* A snapshot is a list of (key, value); key = field << 56 | segment << 48 | page << 40 | index. */
enum field {
    F_SEGMENTS = 1, F_OWN_ENTERED, F_OWNER, F_FREE_COUNT, F_PAGES_RETIRED, F_DIRECT, F_CLASS_FIRST,
    F_CLASS_LAST, F_FREE_FIRST, F_FREE_LAST, F_COLD_FIRST, F_EMPTY_ARENAS, F_STATE, F_CLS, F_USED,
    F_CARVED, F_ITEM_BOUND, F_BLOCK_SIZE, F_CAPACITY, F_ITEM_MUL, F_SHARED_BLOCK_SIZE, F_SHARED_DIVISOR,
    F_THREAD_FREE, F_NEXT, F_PREV, F_FREE_ITEM, F_FREE_LENGTH, F_LOCAL_ITEM, F_LOCAL_LENGTH, F_FULL,
    F_FULL_OUT, F_FIELDS
};
static const char *const field_names[F_FIELDS] = {
    "?", "segment count", "own-segment entry", "segment owner", "free_count", "pages_retired", "direct",
    "classes.first", "classes.last", "free_pages.first", "free_pages.last", "cold_pages", "empty_arena_count",
    "state", "cls", "used", "carved", "item_bound", "block_size", "capacity", "item_mul", "shared_block_size",
    "shared_divisor", "thread_free", "next", "prev", "free item", "free length", "local_free item",
    "local_free length", "full", "full_out"};

#define PAGE_NONE 0xffffffffull
#define PAGE_EMPTY 0xfffffffeull   /* small_empty_page */
#define PAGE_ALIEN 0xfffffffdull   /* not in this heap's segments */
#define LIST_BROKEN 0xffffffffull  /* a list that leaves its page or does not end */

typedef struct snapshot {
    uint64_t *key, *val;
    size_t n, cap;
} snapshot;

static void snap_put(snapshot *s, unsigned field, unsigned seg, unsigned pg, uint64_t index, uint64_t value)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 4096;
        s->key = (uint64_t *)realloc(s->key, s->cap * sizeof *s->key);
        s->val = (uint64_t *)realloc(s->val, s->cap * sizeof *s->val);
        if (s->key == NULL || s->val == NULL) {
            fprintf(stderr, "test_asm: out of memory for a snapshot\n");
            abort();
        }
    }
    s->key[s->n] = (uint64_t)field << 56 | (uint64_t)seg << 48 | (uint64_t)pg << 40 | index;
    s->val[s->n] = value;
    s->n++;
}

static void snap_free(snapshot *s)
{
    free(s->key);
    free(s->val);
    memset(s, 0, sizeof *s);
}

/* A page as segment ordinal * 64 + index. */
static uint64_t page_id(const heap *h, const page *pg)
{
    if (pg == NULL)
        return PAGE_NONE;
    if (pg == &small_empty_page)
        return PAGE_EMPTY;
    uintptr_t seg = (uintptr_t)pg & ~(uintptr_t)SEGMENT_MASK;
    unsigned ord = segment_ordinal(h, seg);
    if (ord == 0xfe)
        return PAGE_ALIEN;
    return (uint64_t)ord * SEGMENT_PAGES + ((uintptr_t)pg - seg) / PAGE_DESC_SIZE;
}

/* The items of a free list as offsets in the segment, then its length. An item outside the page's
 * items, or more items than the page holds, ends the walk with LIST_BROKEN. */
static void snap_list(snapshot *s, unsigned f_item, unsigned f_length, unsigned ord, unsigned i, const page *pg,
                      const block *b)
{
    uintptr_t seg = (uintptr_t)pg & ~(uintptr_t)SEGMENT_MASK, start = seg + (uintptr_t)i * PAGE_SIZE;
    uint64_t n = 0;
    for (; b != NULL; b = link_get(b), n++) {
        uintptr_t a = (uintptr_t)b;
        if (a < start || a >= start + PAGE_SIZE || n > pg->capacity) {
            snap_put(s, f_item, ord, i, n, a - seg);
            snap_put(s, f_length, ord, i, 0, LIST_BROKEN);
            return;
        }
        snap_put(s, f_item, ord, i, n, a - seg);
    }
    snap_put(s, f_length, ord, i, 0, n);
}

static void snapshot_heap(const heap *h, snapshot *s)
{
    const segment *segs[256];
    unsigned nsegs = 0;
    for (const segment *g = h->segments; g != NULL && nsegs < 256; g = g->next)
        segs[nsegs++] = g;
    snap_put(s, F_SEGMENTS, 0, 0, 0, nsegs);
    snap_put(s, F_FREE_COUNT, 0, 0, 0, h->free_count);
    snap_put(s, F_PAGES_RETIRED, 0, 0, 0, h->pages_retired);
    snap_put(s, F_EMPTY_ARENAS, 0, 0, 0, h->empty_arena_count);
    for (unsigned i = 0; i < SHARD_DIRECT_COUNT; i++)
        snap_put(s, F_DIRECT, 0, 0, i, page_id(h, h->direct[i]));
    for (unsigned c = 0; c < SHARD_CLASS_COUNT; c++) {
        snap_put(s, F_CLASS_FIRST, 0, 0, c, page_id(h, h->classes[c].first));
        snap_put(s, F_CLASS_LAST, 0, 0, c, page_id(h, h->classes[c].last));
    }
    snap_put(s, F_FREE_FIRST, 0, 0, 0, page_id(h, h->free_pages.first));
    snap_put(s, F_FREE_LAST, 0, 0, 0, page_id(h, h->free_pages.last));
    snap_put(s, F_COLD_FIRST, 0, 0, 0, page_id(h, h->cold_pages.first));
    for (unsigned k = 0; k < nsegs; k++) {
        const segment *g = segs[nsegs - 1 - k]; /* the oldest first */
        uintptr_t a = (uintptr_t)g;
        /* Entered, or not enterable: its slot is 0 (a segment on a 4 GB boundary) or holds another
         * segment 4 GB away (heap.h). The two heaps' segments lie at different addresses, so only a
         * segment missing from a free slot is a difference; a clean-clone run lost the comparison to a
         * segment on a 4 GB boundary once (2026-12-02). */
        uint32_t slot = (uint32_t)a >> SEGMENT_SHIFT;
        snap_put(s, F_OWN_ENTERED, k, 0, 0, h->own[slot] == a || slot == 0 || h->own[slot] != 0);
        snap_put(s, F_OWNER, k, 0, 0, g->owner == h);
        for (unsigned i = 1; i < SEGMENT_PAGES; i++) {
            const page *pg = (const page *)(a + (uintptr_t)i * PAGE_DESC_SIZE);
            snap_put(s, F_STATE, k, i, 0, pg->state);
            snap_put(s, F_CLS, k, i, 0, pg->cls);
            snap_put(s, F_USED, k, i, 0, (uint32_t)pg->used);
            snap_put(s, F_FULL, k, i, 0, pg->full);
            snap_put(s, F_FULL_OUT, k, i, 0, (uint32_t)pg->full_out);
            snap_put(s, F_CARVED, k, i, 0, pg->carved);
            snap_put(s, F_ITEM_BOUND, k, i, 0, pg->item_bound);
            snap_put(s, F_BLOCK_SIZE, k, i, 0, pg->block_size);
            snap_put(s, F_CAPACITY, k, i, 0, pg->capacity);
            snap_put(s, F_ITEM_MUL, k, i, 0, pg->item_mul);
            snap_put(s, F_SHARED_BLOCK_SIZE, k, i, 0, pg->shared_block_size);
            snap_put(s, F_SHARED_DIVISOR, k, i, 0, pg->shared_divisor);
            snap_put(s, F_THREAD_FREE, k, i, 0, pg->thread_free);
            snap_put(s, F_NEXT, k, i, 0, page_id(h, pg->next));
            snap_put(s, F_PREV, k, i, 0, page_id(h, pg->prev));
            snap_list(s, F_FREE_ITEM, F_FREE_LENGTH, k, i, pg, pg->free);
            snap_list(s, F_LOCAL_ITEM, F_LOCAL_LENGTH, k, i, pg, pg->local_free);
        }
    }
}

static void describe_key(uint64_t key, char *out, size_t size)
{
    unsigned f = (unsigned)(key >> 56), seg = (unsigned)(key >> 48) & 0xff, pg = (unsigned)(key >> 40) & 0xff;
    unsigned long long index = key & 0xffffffffffull;
    const char *name = f < F_FIELDS ? field_names[f] : "?";
    if (f >= F_STATE)
        snprintf(out, size, "segment %u page %u %s [%llu]", seg, pg, name, index);
    else if (f == F_OWN_ENTERED || f == F_OWNER)
        snprintf(out, size, "segment %u %s", seg, name);
    else
        snprintf(out, size, "heap %s [%llu]", name, index);
}

/* 1 when equal; otherwise the first difference is reported. */
static int snapshots_agree(const snapshot *a, const snapshot *b, const char *where)
{
    size_t n = a->n < b->n ? a->n : b->n;
    for (size_t i = 0; i < n; i++) {
        if (a->key[i] != b->key[i] || a->val[i] != b->val[i]) {
            char ka[128], kb[128];
            describe_key(a->key[i], ka, sizeof ka);
            describe_key(b->key[i], kb, sizeof kb);
            harness_fail(__FILE__, __LINE__, "%s: heap state differs: asm %s = %llu (0x%llx), C %s = %llu (0x%llx)", where,
                         ka, (unsigned long long)a->val[i], (unsigned long long)a->val[i], kb,
                         (unsigned long long)b->val[i], (unsigned long long)b->val[i]);
            return 0;
        }
    }
    if (a->n != b->n) {
        harness_fail(__FILE__, __LINE__, "%s: heap state differs: %zu entries through asm, %zu through C", where, a->n, b->n);
        return 0;
    }
    return 1;
}

/* ---- the sequences ------------------------------------------------------------------------------- */

#define SLOTS 1000
#define MAX_CHECKPOINTS 64

typedef struct cell {
    unsigned char *p;
    size_t n;      /* bytes requested, all of them hold the pattern of seed */
    uint64_t seed;
} cell;

/* What one call gave, as both threads must see it. */
typedef struct outcome {
    uint64_t size;    /* the size argument (malloc, realloc) */
    uint64_t usable;  /* shard_usable_size of the result; 0 for NULL */
    uint32_t offset;  /* result & (4 MB - 1); 0xffffffff for NULL or free */
    uint32_t hooks;   /* error hook calls during the call */
    uint16_t op;
    uint8_t kind;     /* segment map kind of the result; 0 for NULL */
    uint8_t seg;      /* small: ordinal of the result's segment in the heap */
} outcome;

/* The mix of a sequence: per mille of the operations. */
typedef struct mix {
    unsigned invalid, bursts, medium, large;
} mix;

enum { INV_INTERIOR16, INV_INTERIOR8, INV_PAGE0, INV_UNCARVED, INV_PAGE_TAIL, INV_STACK, INV_MEDIUM, INV_LARGE, INV_KINDS };
static const char *const inv_names[INV_KINDS] = {"interior +16", "interior +8", "page 0", "uncarved item",
                                                 "page tail", "stack", "medium interior", "large interior"};

/* What A leaves for B. */
typedef struct shared {
    uint64_t seed;
    long ops;
    mix m;
    unsigned trace_every;  /* A single-steps every n-th call (0: none) */
    outcome *log;
    size_t nlog, cap;
    snapshot snaps[MAX_CHECKPOINTS];
    unsigned nsnaps;
    volatile int a_done, b_done;
    double seconds[2];
    unsigned long calls[2], traced_fast, traced_slow, invalid[INV_KINDS], max_free_pages[2], collects[2];
    unsigned long full_pages_seen;
    volatile int failed;   /* a thread failed or the two differed: the coverage counts mean nothing */
} shared;

typedef struct seq {
    shared *sh;
    int is_asm;            /* A: the NASM entries, writes the log; B: the C twins, compares */
    const entries *e;
    rng r;
    cell slots[SLOTS];
    long last;             /* the slot of the latest allocation, -1 none */
    size_t at;             /* position in the log */
    long op;               /* the operation being run */
    int diverged;          /* B: a difference was found; the rest would only repeat it */
    int failures;          /* after SEQ_MAX_FAILURES the sequence stops: the heap may be corrupt */
    unsigned long calls, collects, max_free_pages;
    unsigned checkpoint;
    uint64_t seeds;        /* pattern seeds handed out */
} seq;

static void seq_fail(seq *s, const char *fmt, ...) __attribute__((format(HARNESS_PRINTF, 2, 3)));
static void seq_fail(seq *s, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->failures++;
    harness_fail(__FILE__, __LINE__, "seed %llu, %s thread, operation %ld: %s", (unsigned long long)s->sh->seed,
                 s->e->name, s->op, msg);
}

static outcome describe_result(int op, size_t size, const void *q, int hooks)
{
    outcome o;
    memset(&o, 0, sizeof o);
    o.op = (uint16_t)op;
    o.size = size;
    o.hooks = (uint32_t)hooks;
    o.offset = 0xffffffffu;
    if (q != NULL) {
        o.offset = (uint32_t)((uintptr_t)q & SEGMENT_MASK);
        o.kind = (uint8_t)segmap_kind((uintptr_t)q);
        o.seg = o.kind == SEG_SMALL ? (uint8_t)segment_ordinal(my_heap(), (uintptr_t)q & ~(uintptr_t)SEGMENT_MASK) : 0;
        o.usable = shard_usable_size(q);
    }
    return o;
}

/* A logs the outcome, B compares it with A's. */
static void note(seq *s, outcome o)
{
    shared *sh = s->sh;
    if (s->is_asm) {
        if (sh->nlog == sh->cap) {
            sh->cap = sh->cap ? 2 * sh->cap : 65536;
            sh->log = (outcome *)realloc(sh->log, sh->cap * sizeof *sh->log);
            if (sh->log == NULL) {
                fprintf(stderr, "test_asm: out of memory for the log\n");
                abort();
            }
        }
        sh->log[sh->nlog++] = o;
        return;
    }
    if (s->at >= sh->nlog) {
        seq_fail(s, "%s: the C thread made more calls than the asm thread (%zu)", op_names[o.op], sh->nlog);
        s->diverged = 1;
        return;
    }
    const outcome *a = &sh->log[s->at++];
    if (a->op != o.op || a->size != o.size) {
        seq_fail(s, "call %zu: asm %s(%llu), C %s(%llu): the sequences lost step", s->at - 1, op_names[a->op],
                 (unsigned long long)a->size, op_names[o.op], (unsigned long long)o.size);
        s->diverged = 1;
    } else if (a->offset != o.offset || a->kind != o.kind || a->seg != o.seg || a->usable != o.usable ||
               a->hooks != o.hooks) {
        seq_fail(s, "call %zu, %s(%llu): asm gave offset 0x%x kind %u segment %u usable %llu hooks %u; "
                 "C gave offset 0x%x kind %u segment %u usable %llu hooks %u",
                 s->at - 1, op_names[o.op], (unsigned long long)o.size, a->offset, a->kind, a->seg,
                 (unsigned long long)a->usable, a->hooks, o.offset, o.kind, o.seg, (unsigned long long)o.usable, o.hooks);
        s->diverged = 1;
    }
}

/* The deterministic range (see the top of the file): a heap with more than SHARD_KEEP_FREE_PAGES free
 * pages, or more than one empty arena, decommits the oldest of them once they have been free for the
 * delay, by the clock. When a call leaves it there, shard_collect() decommits those at once: the oldest
 * free pages beyond the kept ones and every empty arena but the newest, which is all a timed decommit
 * of the call could have done (the list is stamped from its oldest page on), so both threads end up
 * equal whatever their clocks said. */
static void keep_deterministic(seq *s)
{
    heap *h = my_heap();
    if (h == NULL)
        return;
    if (h->free_count > s->max_free_pages)
        s->max_free_pages = h->free_count;
    if (h->free_count > SHARD_KEEP_FREE_PAGES || h->empty_arena_count > 1) {
        shard_collect();
        s->collects++;
    }
}

/* One call through the thread's entries: checked, and in A every trace_every-th call single-stepped
 * against the contract's prediction. Logs or compares the outcome. */
static void *seq_call(seq *s, int op, void *p, size_t size, int expect_hook)
{
    uint64_t a0 = op == OP_MALLOC ? size : (uint64_t)(uintptr_t)p;
    uint64_t a1 = op == OP_REALLOC ? size : next64(&cc_rng); /* garbage in the unused argument */
    int before = hook_calls();
    void *q;
    s->calls++;
    if (s->is_asm && s->sh->trace_every && s->calls % s->sh->trace_every == 0) {
        expectation e = contract(op, p, size);
        path t;
        char why[200];
        q = (void *)(uintptr_t)traced_call(s->e->fn[op], a0, a1, op_names[op], &t);
        if (!path_as_expected(&e, &t, why, sizeof why))
            seq_fail(s, "%s(%p, %zu): %s", op_names[op], p, size, why);
        if (e.slow == SLOW_NONE)
            s->sh->traced_fast++;
        else
            s->sh->traced_slow++;
    } else {
        q = (void *)(uintptr_t)checked_call(s->e->fn[op], a0, a1, op_names[op]);
    }
    int hooks = hook_calls() - before;
    keep_deterministic(s);
    if (hooks != expect_hook)
        seq_fail(s, "%s(%p, %zu): %d calls of the error hook, expected %d", op_names[op], p, size, hooks, expect_hook);
    if (op == OP_FREE)
        q = NULL;
    note(s, describe_result(op, size, q, hooks));
    return q;
}

/* Sizes: 0..16, every class boundary and its neighbours, the direct-array and small limits, anything
 * small, some medium, rarely large. */
static size_t draw_size(seq *s)
{
    rng *r = &s->r;
    size_t k = below(r, 1000);
    if (k < s->sh->m.large)
        return ((size_t)1 << 20) + 1 + below(r, (size_t)2 << 20);
    if (k < s->sh->m.large + s->sh->m.medium)
        return SHARD_SMALL_MAX + 1 + below(r, 100000 - SHARD_SMALL_MAX);
    k = below(r, 100);
    if (k < 15)
        return below(r, 17);
    if (k < 50)
        return class_size[below(r, SHARD_CLASS_COUNT)] + below(r, 3) - 1;
    if (k < 53)
        return SHARD_DIRECT_MAX + below(r, 2);
    if (k < 56)
        return SHARD_SMALL_MAX + below(r, 2);
    if (k < 85)
        return 1 + below(r, SHARD_DIRECT_MAX);
    return SHARD_DIRECT_MAX + 1 + below(r, SHARD_SMALL_MAX - SHARD_DIRECT_MAX);
}

static int is_small(const void *p) { return segmap_kind((uintptr_t)p) == SEG_SMALL; }

static void put_block(seq *s, unsigned i, unsigned char *p, size_t n)
{
    cell *c = &s->slots[i];
    c->p = p;
    c->n = n;
    c->seed = s->sh->seed * 1000003u + ++s->seeds;
    fill_range(p, 0, n, c->seed);
    s->last = i;
}

static void check_block(seq *s, const cell *c, size_t n, const char *what)
{
    if (!holds_pattern(c->p, n, c->seed))
        seq_fail(s, "%s: byte %zu of the %zu-byte block %p differs from its pattern", what,
                 pattern_mismatch(c->p, n, c->seed), c->n, (void *)c->p);
}

static void op_malloc(seq *s, unsigned i, size_t n, int through_realloc)
{
    unsigned char *q = (unsigned char *)seq_call(s, through_realloc ? OP_REALLOC : OP_MALLOC, NULL, n, 0);
    if (q == NULL) {
        seq_fail(s, "%s(%zu) gave NULL", through_realloc ? "realloc(NULL)" : "malloc", n);
        return;
    }
    if (((uintptr_t)q & 15) != 0 || shard_usable_size(q) < n)
        seq_fail(s, "malloc(%zu) gave %p with %zu usable bytes", n, (void *)q, shard_usable_size(q));
    put_block(s, i, q, n);
}

static void op_free(seq *s, unsigned i)
{
    cell *c = &s->slots[i];
    check_block(s, c, c->n, "before free");
    seq_call(s, OP_FREE, c->p, 0, 0);
    c->p = NULL;
}

static void op_realloc(seq *s, unsigned i)
{
    cell *c = &s->slots[i];
    size_t bs = shard_usable_size(c->p), quarter = bs / 4, n;
    int small = is_small(c->p);
    switch (below(&s->r, 8)) {
    case 0: n = quarter + below(&s->r, bs - quarter + 1); break; /* inside the class */
    case 1: n = quarter; break;
    case 2: n = quarter > 1 ? quarter - 1 : 1; break;
    case 3: n = quarter > 1 ? 1 + below(&s->r, quarter - 1) : 1; break; /* below a quarter */
    case 4: n = bs; break;
    case 5: n = bs + 1 + below(&s->r, bs); break; /* above */
    case 6: n = 0; break;
    default: n = draw_size(s); break;
    }
    if (n > ((size_t)3 << 20))
        n = (size_t)3 << 20;
    check_block(s, c, c->n, "before realloc");
    unsigned char *q = (unsigned char *)seq_call(s, OP_REALLOC, c->p, n, 0);
    if (n == 0) {
        if (q != NULL)
            seq_fail(s, "realloc(p, 0) gave %p, not NULL", (void *)q);
        c->p = NULL;
        return;
    }
    if (q == NULL) {
        seq_fail(s, "realloc(%p, %zu) gave NULL", (void *)c->p, n);
        return; /* the block stays as it was */
    }
    if (small && (q == c->p) != (n <= bs && n >= quarter))
        seq_fail(s, "realloc of a small block of %zu bytes to %zu: %s", bs, n, q == c->p ? "stayed" : "moved");
    cell moved = *c;
    moved.p = q;
    check_block(s, &moved, n < c->n ? n : c->n, "the kept part after realloc");
    put_block(s, i, q, n);
}

/* A live block of slot kind `want` (1 small, 2 medium, 3 large; 0 any), from a random slot on; -1 none. */
static long find_live(seq *s, int want)
{
    size_t start = below(&s->r, SLOTS);
    for (size_t j = 0; j < SLOTS; j++) {
        size_t i = (start + j) % SLOTS;
        if (s->slots[i].p == NULL)
            continue;
        unsigned kind = segmap_kind((uintptr_t)s->slots[i].p);
        if (want == 0 || (want == 1 && kind == SEG_SMALL) || (want == 2 && kind == SEG_MEDIUM) ||
            (want == 3 && kind == SEG_LARGE))
            return (long)i;
    }
    return -1;
}

/* A pointer that is not a live block, freed or reallocated: the hook must see it exactly once, and
 * the block it points into (if any) must keep its contents. */
static void op_invalid(seq *s)
{
    unsigned kind = (unsigned)below(&s->r, INV_KINDS);
    int through_realloc = (int)below(&s->r, 2);
    size_t n = draw_size(s);
    long i = find_live(s, kind == INV_MEDIUM ? 2 : kind == INV_LARGE ? 3 : kind == INV_STACK ? 0 : 1);
    unsigned char stack_byte[16];
    unsigned char *q = NULL;
    if (kind == INV_STACK) {
        q = stack_byte;
    } else if (i >= 0) {
        unsigned char *p = s->slots[i].p;
        uintptr_t seg = (uintptr_t)p & ~(uintptr_t)SEGMENT_MASK;
        const page *pg = page_of(p);
        uintptr_t start = (uintptr_t)p & ~(uintptr_t)(PAGE_SIZE - 1);
        /* For a small block: the items of p's page, and those carved there (a run's head counts the whole
         * run's in capacity and carved, src/small.h; its item_bound, as a tail's, those of its page). */
        size_t per = 0, here = 0;
        if (kind == INV_UNCARVED || kind == INV_PAGE_TAIL) {
            per = PAGE_SIZE / pg->block_size;
            here = pg->item_bound / (uint32_t)(pg->item_mul * pg->block_size);
        }
        switch (kind) {
        case INV_INTERIOR16: q = pg->block_size >= 32 ? p + 16 : p + 8; break;
        case INV_INTERIOR8: q = p + 8; break;
        case INV_PAGE0: q = (unsigned char *)(seg + 16 * below(&s->r, PAGE_SIZE / 16)); break;
        case INV_UNCARVED:
            if (here < per)
                q = (unsigned char *)(start + here * pg->block_size + (size_t)pg->block_size * below(&s->r, per - here));
            break;
        case INV_PAGE_TAIL:
            if (per * pg->block_size + 16 <= PAGE_SIZE) {
                size_t from = (per * pg->block_size + 15) / 16;
                q = (unsigned char *)(start + 16 * (from + below(&s->r, PAGE_SIZE / 16 - from)));
            }
            break;
        case INV_MEDIUM: q = p + 16; break;
        case INV_LARGE: q = p + 4096; break;
        }
    }
    if (q == NULL)
        return; /* nothing of that kind now (the same in both threads) */
    s->sh->invalid[kind] += s->is_asm;
    hook_seen.ptr = NULL;
    hook_seen.error = 0;
    void *r = seq_call(s, through_realloc ? OP_REALLOC : OP_FREE, q, through_realloc ? n : 0, 1);
    int want = through_realloc ? SHARD_ERROR_INVALID_REALLOC : SHARD_ERROR_INVALID_FREE;
    if (hook_seen.error != want || hook_seen.ptr != q)
        seq_fail(s, "%s (%s) %p: the hook saw error %d for %p", through_realloc ? "realloc" : "free",
                 inv_names[kind], (void *)q, hook_seen.error, hook_seen.ptr);
    if (r != NULL)
        seq_fail(s, "realloc of an invalid pointer (%s) gave %p", inv_names[kind], r);
    if (i >= 0)
        check_block(s, &s->slots[i], s->slots[i].n, "after an invalid pointer near it");
}

/* More blocks of one class than its page holds, into empty slots: full pages. */
static void op_burst_fill(seq *s)
{
    unsigned cls = 10 + (unsigned)below(&s->r, SHARD_CLASS_COUNT - 10); /* 256 bytes and up: 128 or fewer a page */
    size_t count = class_capacity[cls] + 1 + below(&s->r, class_capacity[cls]);
    size_t n = class_size[cls] - below(&s->r, 16);
    size_t start = below(&s->r, SLOTS);
    for (size_t j = 0; j < SLOTS && count > 0; j++) {
        size_t i = (start + j) % SLOTS;
        if (s->slots[i].p == NULL) {
            op_malloc(s, (unsigned)i, n, 0);
            count--;
        }
    }
}

/* The live blocks of a run of slots: pages empty. */
static void op_burst_free(seq *s)
{
    size_t start = below(&s->r, SLOTS), len = 16 + below(&s->r, 48);
    for (size_t j = 0; j < len; j++) {
        size_t i = (start + j) % SLOTS;
        if (s->slots[i].p != NULL)
            op_free(s, (unsigned)i);
    }
}

static int pages_full(const heap *h)
{
    int n = 0;
    for (const segment *g = h ? h->segments : NULL; g != NULL; g = g->next)
        for (unsigned i = 1; i < SEGMENT_PAGES; i++) {
            const page *pg = (const page *)((uintptr_t)g + (uintptr_t)i * PAGE_DESC_SIZE);
            n += pg->state == PAGE_IN_USE && pg->full;
        }
    return n;
}

/* A's snapshot is kept for B; B compares its own with it. */
static void checkpoint(seq *s, const char *what)
{
    shared *sh = s->sh;
    heap *h = my_heap();
    if (h == NULL)
        return;
    int problems = shard_check();
    if (problems != 0)
        seq_fail(s, "shard_check() = %d at %s", problems, what);
    if (s->checkpoint >= MAX_CHECKPOINTS)
        return;
    if (s->is_asm) {
        snapshot_heap(h, &sh->snaps[s->checkpoint]);
        sh->nsnaps = s->checkpoint + 1;
        sh->full_pages_seen += (unsigned long)pages_full(h);
    } else if (s->checkpoint < sh->nsnaps) {
        snapshot mine;
        memset(&mine, 0, sizeof mine);
        snapshot_heap(h, &mine);
        char where[160];
        snprintf(where, sizeof where, "seed %llu, %s after operation %ld", (unsigned long long)sh->seed, what, s->op);
        if (!snapshots_agree(&sh->snaps[s->checkpoint], &mine, where))
            s->diverged = 1;
        snap_free(&mine);
    }
    s->checkpoint++;
}

#define SEQ_MAX_FAILURES 10

static void run_sequence(seq *s)
{
    shared *sh = s->sh;
    long every = sh->ops / 16 > 0 ? sh->ops / 16 : 1;
    double t0 = seconds_now();
    s->r.s = sh->seed;
    s->last = -1;
    for (s->op = 0; s->op < sh->ops && !s->diverged && s->failures < SEQ_MAX_FAILURES; s->op++) {
        size_t k = below(&s->r, 1000);
        unsigned limit = sh->m.invalid;
        if (k < limit) {
            op_invalid(s);
        } else if (k < (limit += sh->m.bursts)) {
            op_burst_fill(s);
        } else if (k < (limit += sh->m.bursts)) {
            op_burst_free(s);
        } else if (k < (limit += 5)) {
            seq_call(s, OP_FREE, NULL, 0, 0);
        } else if (k < (limit += 40)) {
            if (s->last >= 0 && s->slots[s->last].p != NULL)
                op_free(s, (unsigned)s->last); /* the most recent: its page empties and fills again */
        } else {
            unsigned i = (unsigned)below(&s->r, SLOTS);
            if (s->slots[i].p == NULL)
                op_malloc(s, i, draw_size(s), below(&s->r, 20) == 0);
            else if (below(&s->r, 2) == 0)
                op_free(s, i);
            else
                op_realloc(s, i);
        }
        if ((s->op + 1) % every == 0)
            checkpoint(s, "a checkpoint");
    }
    if (s->failures >= SEQ_MAX_FAILURES)
        seq_fail(s, "the sequence stops here after %d failures", SEQ_MAX_FAILURES);
    if (!s->diverged && s->failures == 0)
        checkpoint(s, "the end of the sequence");
    for (unsigned i = 0; i < SLOTS && !s->diverged && s->failures == 0; i++)
        if (s->slots[i].p != NULL)
            op_free(s, i);
    if (!s->diverged && s->failures == 0)
        checkpoint(s, "freeing every block");
    if (s->failures > 0 || s->diverged)
        sh->failed = 1;
    sh->max_free_pages[!s->is_asm] = s->max_free_pages;
    sh->collects[!s->is_asm] = s->collects;
    sh->calls[!s->is_asm] = s->calls;
    sh->seconds[!s->is_asm] = seconds_now() - t0;
}

/* Both threads' heaps hand out their segments' pages in one order (heap.h's colour, which differs from
 * heap to heap), so that their states compare page by page: set before either makes a small segment, by
 * a thread's first call (a medium block: its heap and an arena, the same in both). */
static void same_colour(void)
{
    void *medium = shard_malloc(32768);
    heap *h = my_heap();
    CHECKF(h != NULL && h->segments == NULL, "the sequence's thread has no heap, or small segments already");
    if (h != NULL)
        h->colour = 0;
    shard_free(medium);
}

static void *thread_a(void *arg)
{
    shared *sh = (shared *)arg;
    same_colour();
    seq *s = (seq *)calloc(1, sizeof *s);
    s->sh = sh;
    s->is_asm = 1;
    s->e = &asm_entries;
    run_sequence(s);
    set_flag(&sh->a_done);
    park_forever(); /* alive while B runs: B must not take this heap */
    return NULL;
}

static void *thread_b(void *arg)
{
    shared *sh = (shared *)arg;
    wait_flag(&sh->a_done);
    same_colour();
    seq *s = (seq *)calloc(1, sizeof *s);
    s->sh = sh;
    s->is_asm = 0;
    s->e = &c_entries;
    run_sequence(s);
    if (!s->diverged && s->at != sh->nlog)
        seq_fail(s, "the C thread made %zu calls, the asm thread %zu", s->at, sh->nlog);
    set_flag(&sh->b_done);
    park_forever();
    return NULL;
}

static void compare_sequences(uint64_t seed, long ops, mix m, unsigned trace_every)
{
    shard_stats st;
    shard_get_stats(&st);
    CHECKF(st.heaps_free == 0, "%zu heaps wait in the stack of free heaps: the threads would not start fresh",
           st.heaps_free);
    shared *sh = (shared *)calloc(1, sizeof *sh); /* the parked threads keep it */
    sh->seed = seed;
    sh->ops = ops;
    sh->m = m;
    sh->trace_every = trace_every;
    thread_t a, b;
    if (thread_start(&a, thread_a, sh) != 0 || thread_start(&b, thread_b, sh) != 0) {
        harness_fail(__FILE__, __LINE__, "thread_start failed");
        return;
    }
    wait_flag(&sh->b_done);
    unsigned long invalid = 0;
    for (int k = 0; k < INV_KINDS; k++)
        invalid += sh->invalid[k];
    printf("  seed %llu: %ld operations, %lu calls (asm %.2f s, C %.2f s), %lu single-stepped (%lu fast, %lu slow), "
           "%lu invalid pointers, %lu full pages at checkpoints, %lu free pages at most, %lu collects\n",
           (unsigned long long)seed, ops, sh->calls[0], sh->seconds[0], sh->seconds[1], sh->traced_fast + sh->traced_slow,
           sh->traced_fast, sh->traced_slow, invalid, sh->full_pages_seen, sh->max_free_pages[0], sh->collects[0]);
    fflush(stdout);
    if (sh->failed)
        return;
    if (m.invalid > 0)
        for (int k = 0; k < INV_KINDS; k++)
            CHECKF(sh->invalid[k] > 0, "seed %llu: no invalid pointer of the kind %s was tried", (unsigned long long)seed,
                   inv_names[k]);
    if (trace_every > 0)
        CHECKF(ALWAYS_SLOW ? sh->traced_fast == 0 && sh->traced_slow > 0 : sh->traced_fast > 0 && sh->traced_slow > 0,
               "seed %llu: single-stepped %lu fast and %lu slow calls", (unsigned long long)seed, sh->traced_fast,
               sh->traced_slow);
    CHECKF(sh->full_pages_seen > 0, "seed %llu: no full page at any checkpoint", (unsigned long long)seed);
}

#define LONG_OPS 200000
#define TRACE_EVERY 61 /* a single-stepped call costs some 0.1 ms, natively and under Wine */

static uint64_t long_seed(void)
{
    const char *env = getenv("SHARD_ASM_SEED");
    return env != NULL && *env ? strtoull(env, NULL, 0) : 20261129;
}

/* ---- the tests ----------------------------------------------------------------------------------- */

/* The harness itself: each preserved register spoiled on its own is reported, alone; nothing is
 * reported for a function that keeps them. */
TEST(callcheck_reports_each_spoiled_register)
{
    for (uint64_t which = 0; which < 22; which++) {
        uint64_t bit = (uint64_t)1 << which, mask = 0;
        if ((CC_CHECKED & bit) == 0)
            continue;
        cc_refill();
        callcheck_call2((void *)callcheck_clobber, which, 0, &mask);
        CHECKF(mask == bit, "spoiling %s: mask 0x%llx, expected 0x%llx", cc_names[which], (unsigned long long)mask,
               (unsigned long long)bit);
    }
    uint64_t mask = UINT64_MAX;
    cc_refill();
    callcheck_call2((void *)callcheck_clobber, 99, 0, &mask);
    CHECKF(mask == 0, "a function that spoils nothing: mask 0x%llx", (unsigned long long)mask);
    cc_refill();
    uint64_t r = callcheck_call2((void *)shard_usable_size, 0, 0, &mask); /* a C function: arguments and result */
    CHECK_EQ(r, 0);
    CHECK_EQ(mask, 0);
}

/* The single-stepper counts exactly: callcheck_clobber(99) runs 42 instructions, its `ret` included. */
TEST(single_step_counts_instructions)
{
    path t;
    traced_call((void *)callcheck_clobber, 99, 0, "callcheck_clobber", &t);
    CHECKF(t.slow == SLOW_NONE && t.instructions == 42, "callcheck_clobber(99): %ld instructions, %s, expected 42",
           t.instructions, slow_names[t.slow]);
}

TEST(sequences_agree_long)
{
    mix m = {5, 5, 15, 1};
    compare_sequences(long_seed(), LONG_OPS, m, TRACE_EVERY);
}

/* Mostly invalid pointers among ordinary operations: the hook sees each once through both entries and
 * the heaps stay equal. */
TEST(sequences_agree_invalid_pointers)
{
    mix m = {150, 3, 15, 2};
    compare_sequences(7, LONG_OPS / 10, m, TRACE_EVERY / 4);
}

/* Every call single-stepped. */
TEST(sequences_agree_every_call_single_stepped)
{
    mix m = {40, 5, 10, 1};
    compare_sequences(99, LONG_OPS / 50, m, 1);
}

/* Cases where the path is known, per class: realloc to the class size and to exactly a quarter of it
 * stays on the fast path, one below a quarter or one above the class does not; a free with other items
 * out of the page is fast; a free into a full page and one that empties a page that is not the only
 * one of its class go to small_free_local_slow, the free that empties the only page stays fast. Every
 * other call must take the path the contract gives for the state it finds. */
typedef struct step_case {
    const char *what;
    int op;
    void *p;
    size_t size;
    int fast; /* expected: 1 fast, 0 slow, -1 whatever the contract says for the state as it is */
} step_case;

/* One call through the NASM entry, single-stepped: the path must be the contract's (and c->fast's). */
static void *step(const step_case *c)
{
    path t;
    char why[200];
    uint64_t a0 = c->op == OP_MALLOC ? c->size : (uint64_t)(uintptr_t)c->p;
    uint64_t a1 = c->op == OP_REALLOC ? c->size : next64(&cc_rng);
    expectation e = contract(c->op, c->p, c->size);
    void *r = (void *)(uintptr_t)traced_call(asm_entries.fn[c->op], a0, a1, c->what, &t);
    int fast = ALWAYS_SLOW && c->fast > 0 ? 0 : c->fast;
    CHECKF(fast < 0 || (e.slow == SLOW_NONE) == fast, "%s (size %zu): the contract says %s", c->what, c->size,
           e.slow == SLOW_NONE ? "fast" : slow_names[e.slow]);
    CHECKF(path_as_expected(&e, &t, why, sizeof why), "%s (size %zu): %s", c->what, c->size, why);
    return r;
}

static void fast_path_cases(void *unused)
{
    (void)unused;
    for (unsigned cls = 0; cls < SHARD_CLASS_COUNT; cls++) {
        size_t n = class_size[cls], lowest = cls == 0 ? 0 : class_size[cls - 1] + 1U;
        /* The first block of a class comes from the slow path when the class has no page with items
         * yet (blocks moved up or down by the reallocs of other classes may have made one); the
         * second then finds the items carved with the first, unless the first took the last one. */
        step_case first = {"malloc, the first of its class", OP_MALLOC, NULL, n, -1};
        unsigned char *a = (unsigned char *)step(&first);
        step_case second = {"malloc after it", OP_MALLOC, NULL, lowest + below(&cc_rng, n - lowest + 1), -1};
        unsigned char *b = (unsigned char *)step(&second);
        CHECK(a != NULL && b != NULL);
        fill(a, n, 1);
        fill(b, n, 2);
        step_case same = {"realloc to the class size", OP_REALLOC, b, n, 1};
        CHECK(step(&same) == b);
        step_case quarter = {"realloc to exactly a quarter", OP_REALLOC, b, n / 4, 1};
        CHECK(step(&quarter) == b);
        CHECK_PATTERN(b, n / 4, 2, "after the in-place reallocs");
        step_case below_q = {"realloc to a quarter - 1", OP_REALLOC, b, n / 4 - 1, 0};
        unsigned char *b2 = (unsigned char *)step(&below_q);
        CHECK(b2 != NULL && b2 != b);
        CHECK_PATTERN(b2, n / 4 - 1, 2, "after moving down");
        step_case above = {"realloc to the class size + 1", OP_REALLOC, a, n + 1, 0};
        unsigned char *a2 = (unsigned char *)step(&above);
        CHECK(a2 != NULL && a2 != a);
        CHECK_PATTERN(a2, n, 1, "after moving up");
        unsigned char *c = (unsigned char *)step(&second);
        unsigned char *d = (unsigned char *)step(&second);
        step_case ordinary = {"free with another item out", OP_FREE, c, 0, page_of(c)->used >= 2 ? 1 : -1};
        step(&ordinary);
        step_case last = {"free of the last block", OP_FREE, d, 0, -1};
        step(&last);
        step_case free_null = {"free(NULL)", OP_FREE, NULL, 0, 0};
        step(&free_null);
        checked_call(asm_entries.fn[OP_FREE], (uint64_t)(uintptr_t)b2, 0, "free");
        checked_call(asm_entries.fn[OP_FREE], (uint64_t)(uintptr_t)a2, 0, "free");
    }
    /* A full page and a second page of the class (4 KB: 16 items a page, which waits for one of them
     * when full). */
    enum { FULL_ITEMS = 16 };
    unsigned char *x[FULL_ITEMS + 1];
    for (int i = 0; i <= FULL_ITEMS; i++) {
        step_case m = {"malloc of 4 KB", OP_MALLOC, NULL, 4096, i < FULL_ITEMS ? -1 : 0};
        x[i] = (unsigned char *)step(&m);
    }
    CHECK(page_of(x[0]) == page_of(x[FULL_ITEMS - 1]) && page_of(x[FULL_ITEMS]) != page_of(x[0]));
    step_case into_full = {"free into a full page", OP_FREE, x[0], 0, 0};
    step(&into_full);
    step_case not_sole = {"free that empties a page that is not its class's only one", OP_FREE, x[FULL_ITEMS], 0, 0};
    step(&not_sole);
    for (int i = 1; i < FULL_ITEMS; i++) {
        step_case f = {"free in the only page of the class", OP_FREE, x[i], 0, 1};
        step(&f);
    }
    /* A full page of 1 KB blocks (64 items) waits for 8 of them (an eighth: small.h's wake_of) before it
     * goes back into its list: the owner's first 7 frees into it are fast, the 8th is slow. */
    enum { KB_ITEMS = 64, KB_WAKE = 8 };
    static unsigned char *y[KB_ITEMS + 1];
    for (int i = 0; i <= KB_ITEMS; i++)
        y[i] = (unsigned char *)(uintptr_t)checked_call(asm_entries.fn[OP_MALLOC], 1024, 0, "malloc");
    const page *yp = page_of(y[0]);
    CHECKF(page_of(y[KB_ITEMS - 1]) == yp && page_of(y[KB_ITEMS]) != yp && yp->full && yp->used == KB_WAKE,
           "64 blocks of 1 KB fill a page, marked full with %d to come back: full %d, used %d", KB_WAKE, yp->full,
           yp->used);
    for (int i = 0; i < KB_WAKE; i++) {
        step_case f = {i + 1 < KB_WAKE ? "free into a full page before its wake" : "the free that wakes a full page",
                       OP_FREE, y[i], 0, i + 1 < KB_WAKE};
        step(&f);
    }
    CHECKF(!yp->full && yp->used == KB_ITEMS - KB_WAKE, "after the wake: full %d, used %d (%d expected)", yp->full,
           yp->used, KB_ITEMS - KB_WAKE);
    for (int i = KB_WAKE; i <= KB_ITEMS; i++)
        checked_call(asm_entries.fn[OP_FREE], (uint64_t)(uintptr_t)y[i], 0, "free");
    step_case zero = {"malloc(0)", OP_MALLOC, NULL, 0, 1};
    checked_call(asm_entries.fn[OP_FREE], (uint64_t)(uintptr_t)step(&zero), 0, "free");
    step_case medium = {"malloc of a medium size", OP_MALLOC, NULL, SHARD_SMALL_MAX + 1, 0};
    checked_call(asm_entries.fn[OP_FREE], (uint64_t)(uintptr_t)step(&medium), 0, "free");
}

TEST(fast_paths_taken_exactly_where_the_contract_says)
{
    run_parked(fast_path_cases, NULL); /* a fresh heap: the first block of each class is a slow one */
}

/* Every entry, asm and C, through the checked call on fast and slow paths; results checked. */
typedef struct foreign_blocks {
    unsigned char *p[6];
    size_t n[6];
} foreign_blocks;

static void make_foreign(void *arg)
{
    foreign_blocks *f = (foreign_blocks *)arg;
    const size_t sizes[6] = {24, 24, 1000, 40000, ((size_t)1 << 20) + 5, 7000};
    for (int i = 0; i < 6; i++) {
        f->n[i] = sizes[i];
        f->p[i] = (unsigned char *)shard_malloc(sizes[i]);
        fill(f->p[i], sizes[i], 100 + i);
    }
}

static void registers_kept_by(const entries *e)
{
    void *fm = e->fn[OP_MALLOC], *ff = e->fn[OP_FREE], *fr = e->fn[OP_REALLOC];
    char what[64];
    size_t sizes[200];
    size_t ns = 0;
    for (size_t n = 0; n <= 16; n++)
        sizes[ns++] = n;
    for (unsigned c = 0; c < SHARD_CLASS_COUNT; c++) {
        sizes[ns++] = class_size[c] - 1;
        sizes[ns++] = class_size[c] + 1;
    }
    sizes[ns++] = 20000;
    sizes[ns++] = 100000;
    sizes[ns++] = SHARD_MEDIUM_MAX;
    sizes[ns++] = SHARD_MEDIUM_MAX + 1;
    sizes[ns++] = (size_t)3 << 20;
    /* malloc: the first of a size may be slow, the next ones fast; then realloc within, below, above. */
    static unsigned char *blocks[200][4];
    for (size_t i = 0; i < ns; i++)
        for (int j = 0; j < 4; j++) {
            snprintf(what, sizeof what, "%s malloc(%zu)", e->name, sizes[i]);
            blocks[i][j] = (unsigned char *)(uintptr_t)checked_call(fm, sizes[i], next64(&cc_rng), what);
            CHECKF(blocks[i][j] != NULL && shard_usable_size(blocks[i][j]) >= sizes[i], "%s", what);
            fill(blocks[i][j], sizes[i], i * 4 + j);
        }
    for (size_t i = 0; i < ns; i++) {
        size_t bs = shard_usable_size(blocks[i][0]);
        const size_t to[4] = {bs, bs / 4, bs / 4 > 0 ? bs / 4 - 1 : 0, bs + 1};
        for (int j = 0; j < 4; j++) {
            snprintf(what, sizeof what, "%s realloc(%zu -> %zu)", e->name, sizes[i], to[j]);
            unsigned char *q = (unsigned char *)(uintptr_t)checked_call(fr, (uint64_t)(uintptr_t)blocks[i][j], to[j], what);
            if (to[j] == 0) {
                CHECKF(q == NULL, "%s", what);
                blocks[i][j] = NULL;
                continue;
            }
            CHECKF(q != NULL, "%s", what);
            if (q == NULL)
                continue;
            size_t kept = to[j] < sizes[i] ? to[j] : sizes[i];
            CHECKF(check_pattern(q, kept, i * 4 + j), "%s: contents", what);
            blocks[i][j] = q;
            fill(q, to[j], i * 4 + j);
        }
    }
    for (size_t i = 0; i < ns; i++)
        for (int j = 0; j < 4; j++) {
            snprintf(what, sizeof what, "%s free", e->name);
            checked_call(ff, (uint64_t)(uintptr_t)blocks[i][j], next64(&cc_rng), what);
        }
    /* NULL. */
    checked_call(ff, 0, next64(&cc_rng), "free(NULL)");
    unsigned char *p = (unsigned char *)(uintptr_t)checked_call(fr, 0, 100, "realloc(NULL, 100)");
    CHECK(p != NULL && shard_usable_size(p) == 112);
    /* Invalid pointers, with the recording hook. */
    unsigned char local[32];
    unsigned char *bad[4] = {p + 8, p + 16, (unsigned char *)((uintptr_t)p & ~(uintptr_t)SEGMENT_MASK) + 4096, local};
    for (int k = 0; k < 4; k++) {
        int before = hook_calls();
        snprintf(what, sizeof what, "%s free(invalid %d)", e->name, k);
        checked_call(ff, (uint64_t)(uintptr_t)bad[k], 0, what);
        snprintf(what, sizeof what, "%s realloc(invalid %d)", e->name, k);
        CHECKF(checked_call(fr, (uint64_t)(uintptr_t)bad[k], 50, what) == 0, "%s gave a block", what);
        CHECKF(hook_calls() - before == 2, "%s: %d hook calls for a free and a realloc", what, hook_calls() - before);
    }
    checked_call(ff, (uint64_t)(uintptr_t)p, 0, "free");
    /* Blocks of another thread (alive, parked): realloc within the class stays, above moves, free. */
    foreign_blocks *f = (foreign_blocks *)calloc(1, sizeof *f);
    run_parked(make_foreign, f);
    snprintf(what, sizeof what, "%s realloc(foreign, same class)", e->name);
    CHECKF((unsigned char *)(uintptr_t)checked_call(fr, (uint64_t)(uintptr_t)f->p[0], 32, what) == f->p[0], "%s", what);
    snprintf(what, sizeof what, "%s realloc(foreign, larger)", e->name);
    unsigned char *moved = (unsigned char *)(uintptr_t)checked_call(fr, (uint64_t)(uintptr_t)f->p[5], 9000, what);
    CHECKF(moved != NULL && moved != f->p[5] && check_pattern(moved, f->n[5], 105), "%s", what);
    f->p[5] = moved;
    for (int i = 0; i < 6; i++) {
        CHECK_PATTERN(f->p[i], f->n[i], 100 + i, "a foreign block");
        snprintf(what, sizeof what, "%s free(foreign %d)", e->name, i);
        int before = hook_calls();
        checked_call(ff, (uint64_t)(uintptr_t)f->p[i], 0, what);
        CHECKF(hook_calls() == before, "%s: the hook was called", what);
    }
    free(f);
    CHECK_EQ(shard_check(), 0);
}

/* The item test that both languages' free and realloc make (page_has_item, src/small.h; ITEM_TEST in
 * asm/fast.asm): one multiply and one compare accept exactly the offsets of the carved items, for every
 * class and every offset of a page. Each class's page as the allocator set it up, with carved counts
 * from none to all. */
TEST(item_test_accepts_exactly_the_carved_items_of_every_class)
{
    for (unsigned cls = 0; cls < SHARD_CLASS_COUNT; cls++) {
        uint32_t size = class_size[cls];
        void *p = shard_malloc(size);
        CHECK(p != NULL);
        page t = *page_of(p);
        uint32_t step = page_item_step(&t);
        CHECKF(t.block_size == size && step >= 1 && step <= size && step == t.item_mul * size,
               "class %u: item_mul %u, step %u", cls, t.item_mul, step);
        unsigned cap = class_capacity[cls], counts[] = {0, 1, 2, cap / 2, cap - 1, cap};
        long wrong = 0;
        for (unsigned k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            t.item_bound = counts[k] * step;
            for (uint32_t off = 0; off < PAGE_SIZE; off++) {
                int want = off % size == 0 && off / size < counts[k];
                wrong += page_has_item(&t, (void *)((uintptr_t)16 * PAGE_SIZE + off)) != want;
            }
        }
        CHECKF(wrong == 0, "class %u (%u bytes): %ld offsets judged wrongly", cls, size, wrong);
        shard_free(p);
    }
}

TEST(asm_entries_keep_callee_saved_registers)
{
    registers_kept_by(&asm_entries);
}

TEST(c_entries_keep_callee_saved_registers)
{
    registers_kept_by(&c_entries);
}

/* A thread without a heap: free(NULL) goes through the slow path and creates no heap; the free of a
 * running thread's block takes one (to gather its frees in, src/small.c; not the hardened build), which
 * the in-place realloc of another block and malloc then use. */
typedef struct no_heap {
    unsigned char *theirs[2];
} no_heap;

static void without_heap(void *arg)
{
    no_heap *t = (no_heap *)arg;
#if SLOT_HOLDS_HEAP_NONE
    CHECK(slot_load() == &heap_none);
#else
    CHECK(slot_load() == NULL);
#endif
    CHECK(my_heap() == NULL);
    step_case free_null = {"free(NULL) without a heap", OP_FREE, NULL, 0, 0};
    step(&free_null);
    CHECK(my_heap() == NULL);
    int before = hook_calls();
    step_case free_foreign = {"free(another thread's block) without a heap", OP_FREE, t->theirs[0], 0, 0};
    step(&free_foreign);
    heap *taken = my_heap();
#if SHARD_HARDENED
    CHECK(taken == NULL); /* it gathers no frees */
#else
    CHECK(taken != NULL && taken != &heap_none);
#endif
    step_case realloc_foreign = {"realloc(another thread's block, its class size) without a heap", OP_REALLOC,
                                 t->theirs[1], 112, 0};
    CHECK(step(&realloc_foreign) == t->theirs[1]);
    CHECK_PATTERN(t->theirs[1], 100, 8, "the foreign block after an in-place realloc");
    CHECK(my_heap() == taken);
    CHECK_EQ(hook_calls(), before);
    step_case first = {"malloc without a heap", OP_MALLOC, NULL, 50, 0};
    unsigned char *m = (unsigned char *)step(&first);
    CHECK(m != NULL && shard_usable_size(m) == 64);
    heap *h = my_heap();
    CHECK(h != NULL && h != &heap_none && (taken == NULL || h == taken));
    CHECK(h != NULL && segment_of(m)->owner == h);
    step_case second = {"the second malloc", OP_MALLOC, NULL, 50, 1};
    unsigned char *m2 = (unsigned char *)step(&second);
    checked_call(asm_entries.fn[OP_FREE], (uint64_t)(uintptr_t)m, 0, "free");
    checked_call(asm_entries.fn[OP_FREE], (uint64_t)(uintptr_t)m2, 0, "free");
}

TEST(thread_without_heap_through_asm)
{
    no_heap t;
    t.theirs[0] = (unsigned char *)shard_malloc(100);
    t.theirs[1] = (unsigned char *)shard_malloc(100);
    unsigned char *keep = (unsigned char *)shard_malloc(100); /* the page does not empty */
    fill(t.theirs[0], 100, 7);
    fill(t.theirs[1], 100, 8);
    const page *pg = page_of(t.theirs[0]);
    uint32_t queued = (uint32_t)(pg->thread_free >> 32);
    run_parked(without_heap, &t);
    CHECKF((uint32_t)(pg->thread_free >> 32) == queued + 1, "the foreign free is not in the page's thread_free (count %u)",
           (uint32_t)(pg->thread_free >> 32));
    CHECK_PATTERN(t.theirs[1], 100, 8, "the block reallocated in place by the other thread");
    shard_free(t.theirs[1]);
    shard_free(keep);
    CHECK_EQ(shard_check(), 0);
}

/* Another thread frees a run of blocks of one page of ours: from its SHARD_GATHER_AFTER-th it gathers
 * them (src/small.c), and while a list is gathered the frees into that page stay on the fast path of
 * both languages, up to the list's last item, which the slow path pushes. A pointer into the page that
 * is not an item still reaches the error hook, and no block is lost: the page has every item back. */
#define GATHERED_BLOCKS (SHARD_GATHER_ITEMS + 40)
typedef struct gathered {
    unsigned char *theirs[GATHERED_BLOCKS];
} gathered;

static void frees_gathered(void *arg)
{
    gathered *t = (gathered *)arg;
    void *mine = shard_malloc(40); /* a heap of its own */
    heap *h = my_heap();
    CHECK(h != NULL);
    int fast = 0, before = hook_calls();
    for (int i = 0; i < GATHERED_BLOCKS; i++) {
        if (i == 100) { /* an interior pointer into the gathered page: the hook, the list as it was */
            uint32_t count = h->gather_count;
            step_case bad = {"free(inside another thread's block, its page gathered)", OP_FREE, t->theirs[i] + 8, 0, 0};
            step(&bad);
            CHECK_EQ(hook_calls(), before + 1);
            CHECK_EQ(h->gather_count, count);
            before = hook_calls();
        }
        CHECK_PATTERN(t->theirs[i], 48, 50 + i % 100, "a block before another thread frees it");
        char what[80];
        snprintf(what, sizeof what, "free(another thread's block %d of one page)", i);
        if (i % 7 == 3 && h->gather_page == page_of(t->theirs[i]) && h->gather_count + 1 < SHARD_GATHER_ITEMS) {
            uint32_t count = h->gather_count; /* the C entry, on the same state */
            checked_call(c_entries.fn[OP_FREE], (uint64_t)(uintptr_t)t->theirs[i], 0, what);
            CHECKF(h->gather_count == count + 1 && h->gather_head == (block *)t->theirs[i], "%s in C", what);
            fast++;
            continue;
        }
        step_case c = {what, OP_FREE, t->theirs[i], 0, -1};
        uint32_t count = h->gather_count;
        step(&c);
        if (h->gather_count == count + 1 && h->gather_head == (block *)t->theirs[i])
            fast++;
    }
    CHECK_EQ(hook_calls(), before);
#if SHARD_HARDENED
    CHECK_EQ(fast, 0); /* no gathering */
#else
    CHECKF(fast >= GATHERED_BLOCKS - SHARD_GATHER_AFTER - 2, "%d of %d frees gathered", fast, GATHERED_BLOCKS);
#endif
    void *slow = shard_malloc(3000); /* the first of its class: the slow path pushes the gathered list */
    CHECK(h->gather_page == NULL);
    shard_free(slow);
    shard_free(mine);
}

TEST(another_threads_frees_into_one_page_stay_on_the_fast_path_once_gathered)
{
    gathered *t = (gathered *)calloc(1, sizeof *t);
    for (int i = 0; i < GATHERED_BLOCKS; i++) {
        t->theirs[i] = (unsigned char *)shard_malloc(48);
        fill(t->theirs[i], 48, 50 + i % 100);
    }
    unsigned char *keep = (unsigned char *)shard_malloc(48); /* the page stays in use */
    const page *pg = page_of(t->theirs[0]);
    CHECK(page_of(t->theirs[GATHERED_BLOCKS - 1]) == pg); /* 1,365 items of 48 bytes a page */
    uint32_t queued = (uint32_t)(pg->thread_free >> 32);
    run_parked(frees_gathered, t);
    CHECKF((uint32_t)(pg->thread_free >> 32) == queued + GATHERED_BLOCKS, "%u of the frees are in the page's thread_free",
           (uint32_t)(pg->thread_free >> 32) - queued);
    shard_free(keep);
    free(t);
    CHECK_EQ(shard_check(), 0);
}

#ifdef TEST_TLS_HIGH
extern DWORD port_win64_tls_index;

/* The variant is what it claims: the allocator's index is 64 or above, so HEAP_SLOT finds no offset. */
TEST(tls_index_is_64_or_above)
{
    void *p = shard_malloc(40);
    CHECK(p != NULL);
    CHECKF(port_win64_tls_index >= 64 && port_win64_tls_index != TLS_OUT_OF_INDEXES, "TLS index %lu",
           (unsigned long)port_win64_tls_index);
    CHECK(port_win64_slot_offset == 0);
    shard_free(p);
}
#endif
