/* heap.c - thread heaps: lazy creation through the port's heap slot, the stack of free heaps, the
 * reserve an exited thread leaves, and the list of all heaps (see heap.h).
 *
 * Thread exit (the port's hook, or shard_thread_done) retires the heap: the blocks other threads freed
 * into it are taken in, the only page a class keeps while its thread runs is retired if empty, and the
 * heap keeps a reserve of SHARD_RESERVE_PAGES free pages and SHARD_RESERVE_ARENAS empty arenas for the
 * next thread; the rest of its free memory goes back to the OS at once. Then the heap goes, whole, onto
 * the stack of free heaps, and a new thread pops one before it makes a new heap. The stack's top is a
 * pointer and a change counter swapped together by cmpxchg16b: a pop that read top A and A->next_free
 * could otherwise succeed after A was popped and pushed again with another next. Heaps are never freed,
 * so reading next_free of a stale top is safe. Frees into a heap waiting in the stack gather in its
 * queues of foreign frees; the thread that takes it drains them first.
 *
 * The reserve expires: SHARD_RESERVE_DELAY_MS after the first heap with a reserve entered the stack
 * (`reserve_due`), the next slow path of any thread or thread exit takes the stack whole, takes in what
 * other threads freed into its heaps (the taker is their only owner then), trims every heap in it to
 * what a running thread keeps (SHARD_KEEP_FREE_PAGES pages, one empty arena) and puts the
 * heaps back. The test is one load of `reserve_due` while nothing is due, and the port's clock (no
 * system call on either OS) after that. A thread that finds the stack empty while it is being trimmed
 * waits for the heaps to come back rather than make a new heap: `trimming` is odd while the stack is
 * taken, and a pop believes an empty top only when `trimming` was even and unchanged around reading it.
 *
 * Code that runs in a thread after its exit hook (a destructor of thread-local data) may still allocate:
 * the port refuses to arm the hook again (PORT_SLOT_EXITED), so such a thread borrows a heap for each
 * allocation and gives it straight back; its frees are those of a thread without a heap.
 */
#include "heap.h"

#include "../port/port.h"
#include "error.h"
#include "large.h"
#include "libc.h"

static pair128 free_stack;       /* ptr: heap *, count: changes */
static heap *all_heaps;          /* pushed with a CAS, never popped */
static uint32_t init_state;      /* 0 not started, 1 running, 2 done, 3 failed */
uint64_t heap_reserve_due;       /* port_clock_ms() when the reserves in the stack expire; 0: none */
static uint32_t trimming;        /* odd while the stack is taken whole (trim, check); +1 at take and put back */

/* The top as two plain loads: a torn pair only makes the following cmpxchg16b fail and retry. */
static pair128 read_top(void)
{
    pair128 top;
    top.count = load_relaxed(&free_stack.count);
    top.ptr = load_relaxed(&free_stack.ptr);
    return top;
}

/* Push the chain first .. last (linked by next_free) onto the stack. */
static void push_chain(heap *first, heap *last)
{
    pair128 old = read_top(), desired;
    do {
        last->next_free = old.ptr;
        desired.ptr = first;
        desired.count = old.count + 1;
    } while (!cas128(&free_stack, &old, desired));
}

void heap_give_back(heap *h) { push_chain(h, h); }

/* Take the blocks other threads freed into h (pages and arenas they emptied are seen empty then). */
static void drain(heap *h)
{
    if (load_relaxed(&h->delayed) != NULL)
        small_drain_delayed(h);
    if (load_relaxed(&h->delayed_arenas) != NULL)
        medium_drain_delayed(h);
}

static int has_reserve(const heap *h)
{
    return h->free_count > SHARD_KEEP_FREE_PAGES || h->empty_arena_count > 1;
}

/* Take in what other threads freed into h, then keep `pages` free pages and `arenas` empty arenas and
 * give back the rest now. With `idle` (no thread runs on h) the empty page a class keeps while its
 * thread runs is retired too. */
static void trim_to(heap *h, unsigned pages, unsigned arenas, int idle)
{
    drain(h);
    small_keep(h, pages, idle);
    medium_keep(h, arenas);
}

/* The end of a thread's use of h: drain, keep the reserve, return the rest, and onto the stack. */
void heap_retire(heap *h)
{
    trim_to(h, SHARD_RESERVE_PAGES, SHARD_RESERVE_ARENAS, 1);
    int reserve = has_reserve(h);
    debug_check_heap(h, "heap inconsistent as its thread ends");
    heap_give_back(h);
    /* After the push: a trim that takes the due from now on takes the stack after the push, so h is
     * trimmed either by the trim that consumes an earlier due or by the one this sets. */
    if (reserve) {
        uint64_t none = 0;
        cas_acq_rel(&heap_reserve_due, &none, port_clock_ms() + SHARD_RESERVE_DELAY_MS);
    }
    heap_reserve_tick();
    large_cache_expire();
}

static void heap_exit_hook(void *arg) { heap_retire(arg); }

void heap_thread_done(void)
{
    heap *h = port_heap_slot();
    if (h == NULL)
        return;
    port_heap_slot_set(NULL); /* disarms the exit hook: the heap goes back here, once */
    heap_retire(h);
}

/* Take the stack whole (NULL when empty); `trimming` makes new threads wait for it, not make heaps. */
static heap *take_stack(void)
{
    for (unsigned i = 0;; i++) {
        uint32_t seq = load_relaxed(&trimming);
        if ((seq & 1) == 0 && cas_acq_rel(&trimming, &seq, seq + 1))
            break;
        pause_or_yield(i); /* another trim or check: they are short */
    }
    pair128 old = read_top();
    while (!cas128(&free_stack, &old, (pair128){NULL, old.count + 1})) {
    }
    return old.ptr;
}

static void put_back_stack(heap *first)
{
    if (first != NULL) {
        heap *last = first;
        while (last->next_free != NULL)
            last = last->next_free;
        push_chain(first, last);
    }
    (void)counted(__atomic_fetch_add(&trimming, 1u, __ATOMIC_RELEASE));
}

/* Trim every heap in the stack to what a running thread keeps. */
static void trim_reserves(void)
{
    heap *first = take_stack();
    for (heap *h = first; h != NULL; h = h->next_free) {
        trim_to(h, SHARD_KEEP_FREE_PAGES, 1, 1); /* the taker of the stack is the heaps' only owner */
        debug_check_heap(h, "heap in the free stack inconsistent after trimming its reserve");
    }
    put_back_stack(first);
}

void heap_reserve_expire(uint64_t due)
{
    if ((int64_t)(port_clock_ms() - due) < 0)
        return;
    if (cas_acq_rel(&heap_reserve_due, &due, 0)) /* one thread trims */
        trim_reserves();
}

void heap_collect(void)
{
    heap *h = port_heap_slot();
    if (h != NULL)
        trim_to(h, SHARD_KEEP_FREE_PAGES, 1, 0);
    store_relaxed(&heap_reserve_due, 0);
    trim_reserves();
}

int heap_check_stack(void)
{
    int problems = 0;
    heap *first = take_stack();
    for (heap *h = first; h != NULL; h = h->next_free)
        problems += heap_check(h);
    put_back_stack(first);
    return problems;
}

static heap *pop_free_heap(void)
{
    for (unsigned i = 0;; i++) {
        uint32_t seq = load_acquire(&trimming);
        pair128 old = read_top();
        if (old.ptr == NULL) {
            __atomic_thread_fence(__ATOMIC_ACQUIRE); /* the top is read before `trimming` again */
            if ((seq & 1) == 0 && load_relaxed(&trimming) == seq)
                return NULL; /* empty, and not because a trim or check had taken it */
            pause_or_yield(i); /* the heaps are being trimmed and come back soon */
            continue;
        }
        pair128 desired = {((heap *)old.ptr)->next_free, old.count + 1};
        if (cas128(&free_stack, &old, desired))
            return old.ptr;
    }
}

/* fork() in a multithreaded process: the child keeps only the thread that forked, so a lock another
 * thread held at that moment would stay taken in the child forever. The prepare hook takes every lock
 * of the allocator in a fixed order - the stack of free heaps (whole, as a trim takes it, after any
 * trim in progress), the metadata allocator's, the large-block cache's, the error hook's - and the
 * parent and child hooks give them back. In the child the heaps of the parent's other threads stay
 * with their blocks: the child can use and free those blocks (its frees go to those heaps' queues, which
 * no thread drains: that memory stays with the child until it exits). */
static heap *fork_stack;

static void fork_prepare(void)
{
    fork_stack = take_stack();
    meta_lock_for_fork(1);
    large_lock_for_fork(1);
    error_lock_for_fork(1);
}

static void fork_done(void)
{
    error_lock_for_fork(0);
    large_lock_for_fork(0);
    meta_lock_for_fork(0);
    put_back_stack(fork_stack);
}

/* Once per process: register the thread-exit hook and the fork hooks. */
static int init_once(void)
{
    uint32_t state = load_acquire(&init_state);
    while (state != 2) {
        if (state == 3)
            return -1;
        uint32_t expected = 0;
        if (state == 0 && cas_acq_rel(&init_state, &expected, 1u)) {
            state = port_thread_exit_hook(heap_exit_hook) == 0 &&
                            port_fork_hooks(fork_prepare, fork_done, fork_done) == 0
                        ? 2u
                        : 3u;
            store_release(&init_state, state);
        } else {
            cpu_pause();
            state = load_acquire(&init_state);
        }
    }
    return 0;
}

heap heap_none = {
    .direct = {[0 ... SHARD_DIRECT_COUNT - 1] = &small_empty_page},
    .own = {[0] = 1},
};

static heap *heap_new(void)
{
    heap *h = meta_alloc(sizeof(heap));
    if (h == NULL)
        return NULL;
    for (unsigned i = 0; i < SHARD_DIRECT_COUNT; i++)
        h->direct[i] = &small_empty_page;
    h->own[0] = 1; /* no segment lies at 1: a pointer below 4 MB finds no own segment */
    heap *head = load_relaxed(&all_heaps);
    do {
        h->next_all = head;
    } while (!cas_release(&all_heaps, &head, h));
    return h;
}

heap *heap_get_or_create(int *lent)
{
    heap *h = port_heap_slot();
    if (h != NULL)
        return h;
    if (init_once() != 0)
        return NULL;
    h = pop_free_heap();
    if (h != NULL)
        trim_to(h, UINT32_MAX, UINT32_MAX, 1); /* what was freed into it while it waited; nothing goes back */
    else
        h = heap_new();
    if (h == NULL)
        return NULL;
    int set = port_heap_slot_set(h);
    if (set == PORT_SLOT_EXITED) {
        *lent = 1;
        return h;
    }
    if (set != 0) {
        heap_give_back(h); /* the thread could not own it */
        return NULL;
    }
    return h;
}

int heap_check(heap *h)
{
    int problems = 0;
    size_t segments = 0, entered = 0;
    for (segment *s = h->segments; s != NULL; s = s->next, segments++) {
        if (s->owner != h || segmap_kind((uintptr_t)s) != SEG_SMALL) {
            report_error("segment with a wrong owner or map entry:", (uintptr_t)s);
            problems++;
        }
        uint32_t slot = (uint32_t)(uintptr_t)s >> SEGMENT_SHIFT;
        entered += h->own[slot] == (uintptr_t)s;
        if (h->own[slot] == 0 && slot != 0) {
            report_error("segment missing from its free own-segment entry:", (uintptr_t)s);
            problems++;
        }
        for (unsigned i = 1; i < SEGMENT_PAGES; i++)
            problems += small_check_page((const page *)((const uint8_t *)s + i * PAGE_DESC_SIZE));
    }
    /* Every own-segment entry is one of these segments (entry 0 holds 1), each at most once. */
    size_t entries = 0;
    for (size_t i = 1; i < HEAP_OWN_SLOTS; i++)
        entries += h->own[i] != 0;
    if (h->own[0] != 1 || entries != entered || entered > segments) {
        report_error("own-segment table differs from the heap's segments; entries:", entries);
        problems++;
    }
    for (unsigned cls = 0; cls < SHARD_CLASS_COUNT; cls++) {
        for (const page *pg = h->classes[cls].first; pg != NULL; pg = pg->next) {
            if (pg->state != PAGE_IN_USE || pg->cls != cls || pg->used < 0 || segment_of(pg)->owner != h ||
                pg->sole != (h->classes[cls].first == h->classes[cls].last)) {
                report_error("page in the wrong class list:", (uintptr_t)pg);
                problems++;
            }
        }
    }
    for (unsigned i = 0; i < SHARD_DIRECT_COUNT; i++) {
        const page *first = h->classes[class_by_size16[i]].first;
        if (h->direct[i] != (first ? first : &small_empty_page)) {
            report_error("page-per-size entry differs from its class's first page, size index", i);
            problems++;
        }
    }
    int medium_problems = medium_check(h);
    if (medium_problems != 0) {
        report_error("inconsistencies in the medium arenas or bins:", (uintptr_t)medium_problems);
        problems += medium_problems;
    }
    unsigned free_pages = 0;
    for (const page *pg = h->free_pages.first; pg != NULL; pg = pg->next, free_pages++) {
        if (pg->state != PAGE_FREE) {
            report_error("page in the free pages that is not free:", (uintptr_t)pg);
            problems++;
        }
    }
    if (free_pages != h->free_count) {
        report_error("free page count differs from the list:", h->free_count);
        problems++;
    }
    return problems;
}

heap *heap_all(void) { return load_acquire(&all_heaps); }

size_t heap_free_count(void)
{
    size_t all = 0, n = 0;
    for (heap *h = heap_all(); h != NULL; h = h->next_all)
        all++;
    /* The links change under a concurrent pop and push: never count more than there are heaps. */
    for (heap *h = read_top().ptr; h != NULL && n < all; h = load_relaxed(&h->next_free))
        n++;
    return n;
}
