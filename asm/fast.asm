; fast.asm - shard_malloc, shard_free and shard_realloc for a small block of the calling thread, in NASM,
; for both x86-64 ABIs (abi.inc); the default library's entry points. Everything else goes, by a tail
; jump with the arguments in place, to the C slow paths (src/fast.h, src/api.c), which take any input;
; a malloc whose page has no item passes the heap and the page found too (api_malloc_dry), so that the
; class's slow path need not find them again (bench/results/2026-12-03-class-steps.md).
;
; The steps are exactly those of the C fast paths (src/fast.h lists them); tests/test_asm.c runs both
; on the same operation sequences and compares results and page state field by field. The offsets and
; constants come from gen/layout.py (layout.inc here, src/layout.h checked by _Static_assert in C).
;
; Linux instruction counts on the fast path, `ret` included (tests/test_asm.c checks them exactly by
; single-stepping; bench/instr.py counts them under callgrind): malloc up to 2 KB 15, 2-16 KB 22 (20 and
; 27 when the page's free list is dry and its local_free list is taken instead), free 22
; (also when it empties the only page of its class: that page's `used` counts one more, src/small.c),
; 33 for another heap's block onto the list of frees gathered for its page (src/fast.h), realloc in
; place 24. Where free's go: the heap slot 2, "a small segment of mine" through the heap's
; own-segment table 6, the page descriptor's address 4, the item test (carved and at a multiple of the
; class size, so that an interior or never-handed-out pointer reaches the error hook rather than a free
; list) 4, `used` - 1 and its test 2, the push 3, ret 1. Windows adds 4 to each for the TLS index test
; and the NULL test of its slot. The hardened build (SHARD_HARDENED, src/small.h) adds the decoding and
; the tests of the links: malloc 25 or 26, free 32 to 38, realloc 30 (tests/test_asm.c's HARD_*).

%ifndef SHARD_HARDENED
    %define SHARD_HARDENED 0                        ; 1: the hardened build's checks (src/small.h)
%endif

%include "abi.inc"
%include "layout.inc"
%include "classes.inc"

%define SEGMENT_MASK_NOT (-(1 << SHARD_L_SEGMENT_SHIFT))
%define DESC_SHIFT (SHARD_L_PAGE_SHIFT - SHARD_L_PAGE_DESC_SHIFT)         ; p >> 9 ...
%define DESC_MASK (((1 << (SHARD_L_SEGMENT_SHIFT - SHARD_L_PAGE_SHIFT)) - 1) << SHARD_L_PAGE_DESC_SHIFT) ; ... & 0x1f80

extern api_malloc_slow
extern api_malloc_dry
extern small_empty_page
extern api_free_slow
extern small_free_local_slow
extern api_realloc_slow

%if SHARD_SLOT == PORT_SLOT_TLS
; The heap slot. NASM reaches a TLS variable by gottpoff only if it defines it (an extern gets no TLS
; type), so it lives here, and src/heap.h declares it for C. It starts as &heap_none (see abi.inc).
extern heap_none
section .tdata progbits alloc noexec write tls align=8
global heap_slot:data hidden 8
heap_slot:
    dq heap_none
%endif

section .rodata align=64
SHARD_CLASS_TABLES

section .text align=64

; void *shard_malloc(size_t size)
FUNC shard_malloc
    HEAP_SLOT T1, .slow
    cmp ARG0, SHARD_L_DIRECT_MAX
    ja .class
    lea T2, [ARG0 + 15]
    shr T2, 4
    mov T2, [T1 + T2 * 8 + SHARD_L_HEAP_DIRECT]     ; the page of this size (or the empty page)
.pop:                                               ; T2: a page of the class
    mov rax, [T2 + SHARD_L_PAGE_FREE]
    test rax, rax
    jz .local
.take:                                              ; rax: the first free item of page T2
%if SHARD_HARDENED
    mov T3, T2
    and T3, SEGMENT_MASK_NOT
    mov T1, [rax]
    xor T1, [T3 + SHARD_L_SEGMENT_SECRET]           ; next ^ this item: below 64 KB when next is in this page
    cmp T1, 0xffff
    ja .end_or_damaged
    xor T1, rax                                     ; the next free item
    movzx T4D, T1W                                  ; an item of the page (ITEM_TEST's steps)
    imul T4D, [T2 + SHARD_L_PAGE_ITEM_MUL]
    cmp T4D, [T2 + SHARD_L_PAGE_ITEM_BOUND]
    jae .slow
.fits:
    mov qword [rax], 0                              ; a live block's first word decodes to no link
%else
    mov T1, [rax]                                   ; the next free item
%endif
    mov [T2 + SHARD_L_PAGE_FREE], T1
    add dword [T2 + SHARD_L_PAGE_USED], 1
    prefetchw [T1]                                  ; the next allocation reads its link (NULL: no fault)
    ret
%if SHARD_HARDENED
.end_or_damaged:                                    ; the end of the list (next ^ item = item), or damage
    cmp T1, rax
    jne .slow                                       ; the slow path reports it
    xor T1D, T1D
    jmp .fits
%endif
.local:                                             ; free is dry: other threads' frees, drained, if any
    mov rax, [T2 + SHARD_L_PAGE_LOCAL_FREE]
    test rax, rax
    jz .dry
    mov qword [T2 + SHARD_L_PAGE_LOCAL_FREE], 0
%if SHARD_HARDENED
    mov [T2 + SHARD_L_PAGE_FREE], rax               ; the list stays whole if the slow path must take it
%endif
    jmp .take
.class:                                             ; 2-16 KB: the class table, then the class's first page
    cmp ARG0, SHARD_L_SMALL_MAX
    ja .slow
    lea T2, [ARG0 + 15]
    shr T2, 4
    lea T3, [rel shard_class_by_size16_table]
    movzx T2D, byte [T3 + T2]
    shl T2D, SHARD_L_PAGE_LIST_SHIFT
    mov T2, [T1 + T2 + SHARD_L_HEAP_CLASSES]
    test T2, T2
    jnz .pop
.slow:
    jmp api_malloc_slow
.dry:                                               ; page T2 of heap T1 has no item: its class's slow
    lea T3, [rel small_empty_page]                  ; path at once, api_malloc_dry(size, heap, page),
    cmp T2, T3                                      ; unless it is the empty page (no page in the class)
    je .slow
%if SHARD_ELF
    mov rsi, T1
    mov rdx, T2
%else
    mov rdx, T1                                     ; T1 is r8, the third argument's register
    mov r8, T2
%endif
    jmp api_malloc_dry
ENDFUNC shard_malloc

; The item test: T3 = p's offset in its page; a multiple of the class size below the carved items
; when offset * item_mul mod 2^32 < item_bound (page_has_item in src/small.h says why).
; %1: the descriptor, %2: where to go when p is not an item.
%macro ITEM_TEST 2
    movzx T3D, ARG0W
    imul T3D, [%1 + SHARD_L_PAGE_ITEM_MUL]
    cmp T3D, [%1 + SHARD_L_PAGE_ITEM_BOUND]
    jae %2
%endmacro

; When ARG0 lies in a small segment of the heap in T1: rax = the segment and T2 = ARG0's page descriptor;
; else to %1. The descriptor's address is formed once, not left to each access as [rax + T2]: with base
; and index, the free's store of `free` and the next malloc's load of it (a base alone) made a
; malloc/free pair of bench/micro's fixed-32 take 4.4 ns, against 2.5 with one base.
%macro OWN_PAGE 1
    mov rax, ARG0
    and rax, SEGMENT_MASK_NOT                       ; the segment
    mov T2D, ARG0D
    shr T2D, SHARD_L_SEGMENT_SHIFT                  ; address bits 22..31
    cmp rax, [T1 + T2 * 8 + SHARD_L_HEAP_OWN]
    jne %1
    mov T2, ARG0
    shr T2, DESC_SHIFT
    and T2D, DESC_MASK                              ; 128 * page index
    add T2, rax
%endmacro

; Hardened build: to %1 when ARG0's first word decodes to the end of a list or to an address in its own
; page, as a free item's link does (src/small.h); a live block's word passes but for one value in 2^48.
; The word ^ the secret is next ^ ARG0: ARG0 itself at the end, below 64 KB for a next in the page.
; rax: the segment. The slow path tests exactly (small_looks_free).
%macro LOOKS_FREE 1
    mov T4, [ARG0]
    xor T4, [rax + SHARD_L_SEGMENT_SECRET]
    cmp T4, 0xffff
    jbe %1
    cmp T4, ARG0
    je %1
%endmacro

; void shard_free(void *p)
FUNC shard_free
    HEAP_SLOT T1, .slow
    OWN_PAGE .foreign
    ITEM_TEST T2, .own_slow
%if SHARD_HARDENED
    LOOKS_FREE .own_slow                            ; perhaps a double free: the slow path decides
%endif
    sub dword [T2 + SHARD_L_PAGE_USED], 1
    jle .undo                                       ; emptied (not its class's only page), or full
    mov T4, [T2 + SHARD_L_PAGE_FREE]                ; onto `free`: the next malloc of the class takes
%if SHARD_HARDENED                                  ; this item back while it is still in the cache
    test T4, T4
    jz .encode
    mov T3, [T4]                                    ; the head's link must fit (an overflow out of this
    xor T3, [rax + SHARD_L_SEGMENT_SECRET]          ; block into the next item shows here): next ^ head
    cmp T3, 0xffff                                  ; is below 64 KB, or the head itself (the end)
    jbe .encode
    cmp T3, T4
    jne .undo                                       ; the slow path reports it
.encode:
    xor T4, ARG0
    xor T4, [rax + SHARD_L_SEGMENT_SECRET]
%endif
    mov [ARG0], T4
    mov [T2 + SHARD_L_PAGE_FREE], ARG0
    ret
.undo:                                              ; the slow path gets the page as it was
    add dword [T2 + SHARD_L_PAGE_USED], 1
.own_slow:                                          ; small_free_local_slow(heap, page, p)
%if SHARD_ELF
    mov rdx, rdi
    mov rsi, T2
    mov rdi, T1
%else
    mov rdx, T2
    xchg rcx, r8                                    ; T1 is r8, the third argument's register
%endif
    jmp small_free_local_slow
.foreign:                                           ; rax: p's segment; another heap's block, or not ours
%if SHARD_HARDENED
    jmp api_free_slow
%else                                               ; in the page whose frees this thread gathers?
    mov T2, ARG0
    shr T2, DESC_SHIFT
    and T2D, DESC_MASK
    add T2, rax                                     ; p's page descriptor
    cmp T2, [T1 + SHARD_L_HEAP_GATHER_PAGE]
    jne .slow
    test T2, T2                                     ; 0: none gathered, and p below 64 KB (NULL)
    jz .slow
    movzx T4D, ARG0W                                ; an item of the page, as small_valid_foreign tests
    mov rax, T4                                     ; from the descriptor's shared line: a multiple
    imul rax, [T2 + SHARD_L_PAGE_SHARED_DIVISOR]    ; of the block size ...
    cmp rax, [T2 + SHARD_L_PAGE_SHARED_DIVISOR]
    jae .slow
    add T4D, [T2 + SHARD_L_PAGE_SHARED_BLOCK_SIZE]  ; ... that ends inside the page
    cmp T4D, 1 << SHARD_L_PAGE_SHIFT
    ja .slow
    mov T4D, [T1 + SHARD_L_HEAP_GATHER_COUNT]
    add T4D, 1
    cmp T4D, SHARD_L_GATHER_ITEMS                   ; the list's last item: the slow path pushes it
    jae .slow
    mov T3, [T1 + SHARD_L_HEAP_GATHER_HEAD]
    mov [ARG0], T3                                  ; onto the gathered list
    mov [T1 + SHARD_L_HEAP_GATHER_HEAD], ARG0
    mov [T1 + SHARD_L_HEAP_GATHER_COUNT], T4D
    ret
%endif
.slow:
    jmp api_free_slow
ENDFUNC shard_free

; void *shard_realloc(void *p, size_t size)
FUNC shard_realloc
    HEAP_SLOT T1, .slow
    OWN_PAGE .slow
    mov T1D, [T2 + SHARD_L_PAGE_BLOCK_SIZE]
    cmp ARG1, T1
    ja .slow                                        ; above the class
    shr T1D, 2
    cmp ARG1, T1
    jb .slow                                        ; below a quarter of it
    ITEM_TEST T2, .slow
%if SHARD_HARDENED
    LOOKS_FREE .slow                                ; a freed block: the slow path reports it
%endif
    mov rax, ARG0
    ret
.slow:
    jmp api_realloc_slow
ENDFUNC shard_realloc

%if SHARD_SLOT == PORT_SLOT_FUNCTION
; rax = the calling thread's heap (NULL: none), from the word whose address port_heap_slot_address
; returns; every other register is kept, so that the fast paths around the call keep their arguments
; and need no frame. Called at a fast path's entry: rsp is 16n + 8 there, 16n here, and stays so after
; the eight pushes; Win64 adds the callee's 32 bytes of shadow space.
extern port_heap_slot_address
%if SHARD_ELF
    %define SLOT_SHADOW 0
%else
    %define SLOT_SHADOW 32
%endif
align 16
heap_slot_fetch:
    push rcx
.p1:
    push rdx
.p2:
    push rsi
.p3:
    push rdi
.p4:
    push r8
.p5:
    push r9
.p6:
    push r10
.p7:
    push r11
.p8:
%if SLOT_SHADOW
    sub rsp, SLOT_SHADOW
%endif
.prologue_end:
    call port_heap_slot_address
    mov rax, [rax]
%if SLOT_SHADOW
    add rsp, SLOT_SHADOW
%endif
    pop r11
    pop r10
    pop r9
    pop r8
    pop rdi
    pop rsi
    pop rdx
    pop rcx
    ret
.end:
%if !SHARD_ELF
; Its unwind data (the function table entry and UNWIND_INFO of the x64 ABI): the prologue's steps,
; last first, each as (offset after it, operation | register << 4); UWOP_PUSH_NONVOL = 0 names the
; register pushed (rcx 1, rdx 2, rsi 6, rdi 7, r8-r11 8-11), UWOP_ALLOC_SMALL = 2 the stack taken,
; (32 - 8) / 8 = 3. Nine codes, and the array padded to an even length.
section .pdata rdata align=4
    dd heap_slot_fetch wrt ..imagebase
    dd heap_slot_fetch.end wrt ..imagebase
    dd slot_fetch_unwind wrt ..imagebase
section .xdata rdata align=8
slot_fetch_unwind:
    db 1, heap_slot_fetch.prologue_end - heap_slot_fetch, 9, 0
    db heap_slot_fetch.prologue_end - heap_slot_fetch, 0x32
    db heap_slot_fetch.p8 - heap_slot_fetch, 0xb0
    db heap_slot_fetch.p7 - heap_slot_fetch, 0xa0
    db heap_slot_fetch.p6 - heap_slot_fetch, 0x90
    db heap_slot_fetch.p5 - heap_slot_fetch, 0x80
    db heap_slot_fetch.p4 - heap_slot_fetch, 0x70
    db heap_slot_fetch.p3 - heap_slot_fetch, 0x60
    db heap_slot_fetch.p2 - heap_slot_fetch, 0x20
    db heap_slot_fetch.p1 - heap_slot_fetch, 0x10
    db 0, 0
%endif
%endif

%if SHARD_ELF
section .note.GNU-stack noalloc noexec nowrite progbits
%elifdef SHARD_BUILD_DLL
; The DLL exports what the C side marks __declspec(dllexport); these come from here.
section .drectve info
    db " -export:shard_malloc -export:shard_free -export:shard_realloc"
%endif
