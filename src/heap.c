/* heap.c - thread heaps: lazy creation through the port's heap slot, the stack of free heaps, and the
 * list of all heaps (see heap.h).
 *
 * Thread exit (the port's hook) pushes the heap, whole, onto the free stack; a new thread pops one
 * before it makes a new heap. The stack's top is a pointer and a change counter swapped together by
 * cmpxchg16b: a pop that read top A and A->next_free could otherwise succeed after A was popped and
 * pushed again with another next. Heaps are never freed, so reading next_free of a stale top is safe.
 * Trimming the memory an exiting heap keeps is the thread-lifecycle issue's work; for now a heap keeps
 * what it had (its free pages age out once its next owner passes a slow path).
 * Code that runs in a thread after its exit hook (a destructor of thread-local data) may still allocate:
 * the port refuses to arm the hook again (PORT_SLOT_EXITED), so such a thread borrows a heap for each
 * allocation and gives it straight back; its frees are those of a thread without a heap.
 */
#include "heap.h"

#include "../port/port.h"
#include "large.h"
#include "libc.h"

static pair128 free_stack;       /* ptr: heap *, count: changes */
static heap *all_heaps;          /* pushed with a CAS, never popped */
static uint32_t init_state;      /* 0 not started, 1 running, 2 done, 3 failed */

/* The top as two plain loads: a torn pair only makes the following cmpxchg16b fail and retry. */
static pair128 read_top(void)
{
    pair128 top;
    top.count = load_relaxed(&free_stack.count);
    top.ptr = load_relaxed(&free_stack.ptr);
    return top;
}

void heap_give_back(heap *h)
{
    pair128 old = read_top(), desired;
    do {
        h->next_free = old.ptr;
        desired.ptr = h;
        desired.count = old.count + 1;
    } while (!cas128(&free_stack, &old, desired));
}

/* At thread exit the medium chunks other threads freed are merged while the owner still runs, so an
 * arena they emptied is seen empty; then the heap goes on the stack. */
static void on_thread_exit(void *arg)
{
    heap *h = arg;
    if (load_relaxed(&h->delayed_arenas) != NULL)
        medium_drain_delayed(h);
    heap_give_back(h);
    large_cache_expire();
}

static heap *pop_free_heap(void)
{
    pair128 old = read_top(), desired;
    do {
        if (old.ptr == NULL)
            return NULL;
        desired.ptr = ((heap *)old.ptr)->next_free;
        desired.count = old.count + 1;
    } while (!cas128(&free_stack, &old, desired));
    return old.ptr;
}

/* Once per process: register the thread-exit hook. */
static int init_once(void)
{
    uint32_t state = load_acquire(&init_state);
    while (state != 2) {
        if (state == 3)
            return -1;
        uint32_t expected = 0;
        if (state == 0 && cas_acq_rel(&init_state, &expected, 1u)) {
            state = port_thread_exit_hook(on_thread_exit) == 0 ? 2u : 3u;
            store_release(&init_state, state);
        } else {
            cpu_pause();
            state = load_acquire(&init_state);
        }
    }
    return 0;
}

static heap *heap_new(void)
{
    heap *h = meta_alloc(sizeof(heap));
    if (h == NULL)
        return NULL;
    for (unsigned i = 0; i < SHARD_DIRECT_COUNT; i++)
        h->direct[i] = &small_empty_page;
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
    if (h == NULL)
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
