; callcheck.asm - the checked call of tests/test_asm.c, checkasm's idea for both x86-64 ABIs: call a
; function with random values in every register the ABI says a callee must preserve, garbage in the
; volatile registers that carry no argument, and report afterwards which preserved register changed.
;
;   uint64_t callcheck_call2(void *fn, uint64_t a0, uint64_t a1, uint64_t *clobbered)
;       calls fn(a0, a1) and returns its rax; *clobbered gets a mask of CALLCHECK_BIT_* (0: all kept)
;   uint64_t callcheck_trace2(void *fn, uint64_t a0, uint64_t a1, uint64_t *clobbered)
;       the same with the trap flag set for the call: the processor stops after every instruction from
;       the call on, and test_asm.c's handler counts them; it clears the flag when the instruction
;       pointer reaches callcheck_trace_return (the fn's `ret` has run) or a slow-path entry.
;   void callcheck_clobber(uint64_t which)
;       a deliberately bad function that changes the preserved register of bit `which` (or rsp, or the
;       direction flag) and nothing else; any other `which` changes nothing. For the test of the tests.
;
; The values come from callcheck_values[] (uint64_t, test_asm.c fills them with random numbers):
;   0 rbx, 1 rbp, 2 r12, 3 r13, 4 r14, 5 r15, 6 rdi, 7 rsi       (6, 7 checked on Win64 only)
;   8 + 2k, 9 + 2k: xmm(6 + k), k = 0..9, low and high half      (Win64 only)
;   28 rax, 29 rcx, 30 rdx, 31 r8, 32 r9, 33 r10, 34 r11         garbage for the volatile ones
; The mask has the same bit numbers for the preserved registers (bit 8 + k for xmm(6 + k)), and:
;   bit 20 (CALLCHECK_BIT_RSP): rsp differs after the call (it is put back from callcheck_saved_rsp)
;   bit 21 (CALLCHECK_BIT_DF): the direction flag is set after the call (both ABIs want it clear)
; callcheck_saved_rsp is one global word: one thread at a time may use the checked call.
;
; Stack at the call: 16-byte aligned, and on Win64 with the 32 bytes of shadow space above the return
; address (which the callee may overwrite; nothing of ours lives there).

%ifidn __OUTPUT_FORMAT__, win64
    %define WIN64 1
%elifidn __OUTPUT_FORMAT__, elf64
    %define WIN64 0
%else
    %error "callcheck.asm: assemble with -f elf64 or -f win64"
%endif

%define BIT_RSP (1 << 20)
%define BIT_DF (1 << 21)
%define VAL(i) [rel callcheck_values + 8 * (i)]

extern callcheck_values

%if WIN64
    %define A0 rcx
    %define A1 rdx
    %define A2 r8
    %define A3 r9
    ; 8 pushes leave rsp at 8 mod 16; FRAME is 8 mod 16 too, so rsp is aligned at the call.
    %define FRAME 216
    %define SLOT_FN 32              ; above the shadow space [rsp + 0, rsp + 32)
    %define SLOT_MASK_PTR 40
    %define SLOT_XMM 48             ; xmm6..xmm15, 16 bytes each, up to 208
    %macro GLOBAL_FUNC 1
        global %1
        %1:
    %endmacro
%else
    %define A0 rdi
    %define A1 rsi
    %define A2 rdx
    %define A3 rcx
    ; 6 pushes leave rsp at 8 mod 16; FRAME is 8 mod 16 too.
    %define FRAME 24
    %define SLOT_FN 0
    %define SLOT_MASK_PTR 8
    %macro GLOBAL_FUNC 1
        global %1:function (%1.end - %1)
        %1:
    %endmacro
%endif

section .bss
align 8
global callcheck_saved_rsp
callcheck_saved_rsp:
    resq 1

section .text

; %1 register, %2 its index in callcheck_values and its bit in the mask (in r11)
%macro CHECK_GPR 2
    cmp %1, VAL(%2)
    je %%same
    or r11, 1 << (%2)
%%same:
%endmacro

; %1: k, for xmm(6 + k)
%macro CHECK_XMM 1
    %assign %%r 6 + (%1)
    movdqu xmm0, VAL(8 + 2 * (%1))
    pcmpeqb xmm0, xmm%[%%r]
    pmovmskb r10d, xmm0
    cmp r10d, 0xffff
    je %%same
    or r11, 1 << (8 + (%1))
%%same:
%endmacro

; The checked call; %1 the function's name, %2 1 to set the trap flag around the call.
%macro CHECKED_CALL 2
GLOBAL_FUNC %1
    push rbx
    push rbp
    push r12
    push r13
    push r14
    push r15
%if WIN64
    push rdi
    push rsi
%endif
    sub rsp, FRAME
%if WIN64
    %assign k 0
    %rep 10
        %assign r 6 + k
        movdqu [rsp + SLOT_XMM + 16 * k], xmm%[r]
        %assign k k + 1
    %endrep
%endif
    mov [rsp + SLOT_FN], A0
    mov [rsp + SLOT_MASK_PTR], A3
    mov [rel callcheck_saved_rsp], rsp
%if WIN64
    mov rcx, A1                     ; the two arguments (A1 is rdx: read it before rdx is written)
    mov rdx, A2
%else
    mov rdi, A1
    mov rsi, A2
%endif
    mov rbx, VAL(0)
    mov rbp, VAL(1)
    mov r12, VAL(2)
    mov r13, VAL(3)
    mov r14, VAL(4)
    mov r15, VAL(5)
%if WIN64
    mov rdi, VAL(6)
    mov rsi, VAL(7)
    %assign k 0
    %rep 10
        %assign r 6 + k
        movdqu xmm%[r], VAL(8 + 2 * k)
        %assign k k + 1
    %endrep
    mov r8, VAL(31)
    mov r9, VAL(32)
%else
    mov rcx, VAL(29)
    mov rdx, VAL(30)
    mov r8, VAL(31)
    mov r9, VAL(32)
%endif
    mov rax, VAL(28)
    mov r10, VAL(33)
    mov r11, VAL(34)
%if %2
    pushfq
    or qword [rsp], 0x100           ; TF: a trap after each instruction from the one after popfq on
    popfq
%endif
    call [rsp + SLOT_FN]
%if %2
global callcheck_trace_return
callcheck_trace_return:             ; the handler clears TF here; clear it also in case it did not run
    pushfq
    and qword [rsp], ~0x100
    popfq
%endif
    xor r11d, r11d
    cmp rsp, [rel callcheck_saved_rsp]
    je %%rsp_kept
    mov rsp, [rel callcheck_saved_rsp]
    mov r11d, BIT_RSP
%%rsp_kept:
    pushfq
    pop r10
    test r10d, 0x400
    jz %%df_clear
    or r11d, BIT_DF
    cld
%%df_clear:
    CHECK_GPR rbx, 0
    CHECK_GPR rbp, 1
    CHECK_GPR r12, 2
    CHECK_GPR r13, 3
    CHECK_GPR r14, 4
    CHECK_GPR r15, 5
%if WIN64
    CHECK_GPR rdi, 6
    CHECK_GPR rsi, 7
    %assign k 0
    %rep 10
        CHECK_XMM k
        %assign k k + 1
    %endrep
%endif
    mov rcx, [rsp + SLOT_MASK_PTR]
    mov [rcx], r11
%if WIN64
    %assign k 0
    %rep 10
        %assign r 6 + k
        movdqu xmm%[r], [rsp + SLOT_XMM + 16 * k]
        %assign k k + 1
    %endrep
%endif
    add rsp, FRAME
%if WIN64
    pop rsi
    pop rdi
%endif
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbp
    pop rbx
    ret
%1.end:
%endmacro

CHECKED_CALL callcheck_call2, 0
CHECKED_CALL callcheck_trace2, 1

; %1: which, %2: the instruction that spoils it
%macro CLOBBER_CASE 2
    cmp A0, %1
    jne %%next
    %2
    ret
%%next:
%endmacro

GLOBAL_FUNC callcheck_clobber
    CLOBBER_CASE 0, {not rbx}
    CLOBBER_CASE 1, {not rbp}
    CLOBBER_CASE 2, {not r12}
    CLOBBER_CASE 3, {not r13}
    CLOBBER_CASE 4, {not r14}
    CLOBBER_CASE 5, {not r15}
    CLOBBER_CASE 6, {not rdi}
    CLOBBER_CASE 7, {not rsi}
    pcmpeqb xmm0, xmm0              ; all ones: pxor with it changes every bit
    %assign k 0
    %rep 10
        %assign r 6 + k
        CLOBBER_CASE 8 + k, {pxor xmm%[r], xmm0}
        %assign k k + 1
    %endrep
    cmp A0, 21
    jne .not_df
    std
    ret
.not_df:
    cmp A0, 20
    jne .nothing
    pop r11                         ; return 16 bytes below where the caller's rsp should be
    lea rsp, [rsp - 16]
    jmp r11
.nothing:
    ret
callcheck_clobber.end:

%if WIN64 == 0
section .note.GNU-stack noalloc noexec nowrite progbits
%endif
