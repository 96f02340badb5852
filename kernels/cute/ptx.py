"""Inline PTX for the chunk kernels: bf16 pairs (plain and split in two) and the warp MMA.

The register layouts are the PTX ISA's for `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`
(lane = 4 g + t): A (16 x 16) a0 a1 at row g, columns 2t, 2t + 1; a2 a3 at row g + 8; a4 a5 and
a6 a7 the same rows at columns 2t + 8, 2t + 9. B (16 x 8, K x N): b0 b1 at rows 2t, 2t + 1 of
column g; b2 b3 at rows 2t + 8, 2t + 9. C and D (16 x 8): c0 c1 at row g, columns 2t, 2t + 1;
c2 c3 at row g + 8. Each 32-bit operand register holds a pair, the lower index in its low half.
So two neighbouring C tiles (columns 0-7 and 8-15) are, pair for pair, one A operand: a product's
result feeds the next product without leaving the registers.
"""

from __future__ import annotations

from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

_SPLIT = """{
.reg .b32 t0, t1;
.reg .f32 f0, f1;
cvt.rn.bf16x2.f32 $0, $3, $2;
shl.b32 t0, $0, 16;
and.b32 t1, $0, 0xffff0000;
mov.b32 f0, t0;
mov.b32 f1, t1;
sub.f32 f0, $2, f0;
sub.f32 f1, $3, f1;
cvt.rn.bf16x2.f32 $1, f1, f0;
}"""


def _asm(result, operands, text: str, constraints: str, loc=None, ip=None):
    return llvm.inline_asm(result, operands, text, constraints, has_side_effects=False,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                           loc=loc, ip=ip)


@dsl_user_op
def pack_bf16x2(x0: Float32, x1: Float32, *, loc=None, ip=None) -> Int32:
    """The pair (x0, x1) rounded to bf16, x0 in the low half."""
    return Int32(_asm(T.i32(), [Float32(x1).ir_value(loc=loc, ip=ip),
                                Float32(x0).ir_value(loc=loc, ip=ip)],
                      "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", loc, ip))


@dsl_user_op
def split_bf16x2(x0: Float32, x1: Float32, *, loc=None, ip=None) -> tuple[Int32, Int32]:
    """(high, low) bf16 pairs with x = high + low to about 16 bits: the operands of a product
    split in three (high x high + high x low + low x high), near fp32 on bf16 tensor cores."""
    pair = _asm(llvm.StructType.get_literal([T.i32(), T.i32()]),
                [Float32(x0).ir_value(loc=loc, ip=ip), Float32(x1).ir_value(loc=loc, ip=ip)],
                _SPLIT, "=r,=r,f,f", loc, ip)
    return (Int32(llvm.extractvalue(T.i32(), pair, [0], loc=loc, ip=ip)),
            Int32(llvm.extractvalue(T.i32(), pair, [1], loc=loc, ip=ip)))


@dsl_user_op
def mma_bf16(a0: Int32, a1: Int32, a2: Int32, a3: Int32, b0: Int32, b1: Int32, c0: Float32,
             c1: Float32, c2: Float32, c3: Float32, *, loc=None,
             ip=None) -> tuple[Float32, Float32, Float32, Float32]:
    """D = A B + C for one 16 x 8 x 16 tile (bf16 operands, fp32 accumulate), one warp."""
    ints = [Int32(x).ir_value(loc=loc, ip=ip) for x in (a0, a1, a2, a3, b0, b1)]
    floats = [Float32(x).ir_value(loc=loc, ip=ip) for x in (c0, c1, c2, c3)]
    result = _asm(llvm.StructType.get_literal([T.f32()] * 4), ints + floats,
                  "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                  "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                  "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", loc, ip)
    return tuple(Float32(llvm.extractvalue(T.f32(), result, [i], loc=loc, ip=ip))
                 for i in range(4))


def canonical_word(mn, k, MN: int):
    """The 32-bit word (a bf16 pair along K, k even) holding element (mn, k) of an MN x K bf16
    operand stored in the canonical K-major layout `smem_descriptor` reads with leading offset
    16 MN bytes: core matrices of 8 rows (mn) by 8 elements (k), 128 bytes each, the MN / 8 of
    one K octet side by side, then the next K octet."""
    return k // 8 * (MN * 4) + mn // 8 * 32 + mn % 8 * 4 + k % 8 // 2


def smem_descriptor(address: Int32, leading: int, stride: int) -> Int64:
    """The wgmma descriptor of a bf16 operand in shared memory at byte address `address`, in
    the canonical K-major layout without swizzle: 8 x 8 core matrices of 128 contiguous bytes
    (a row of 8 elements per 16 bytes), `leading` bytes between core matrices neighbouring in K,
    `stride` bytes between those neighbouring in M or N (the PTX ISA's matrix descriptor:
    address, leading and stride offsets in 16-byte units at bits 0, 16 and 32; swizzle 0)."""
    return (Int64(address >> 4) & 0x3FFF) | Int64((leading >> 4) << 16) | Int64(
        (stride >> 4) << 32)


@dsl_user_op
def wgmma_bf16(a0: Int32, a1: Int32, a2: Int32, a3: Int32, desc: Int64, acc: list,
               accumulate: bool = True, *, loc=None, ip=None) -> list:
    """D = A B + D (D = A B when not `accumulate`: acc's values unread) for one 64 x N x 16
    tile on one warpgroup (N = 2 len(acc)): A (64 x 16,
    bf16) from registers, in each warp the `mma.sync` A fragment of its 16 rows; B (16 x N,
    bf16) from shared memory through `desc`, K-major; D (fp32) in each warp the `mma.sync`
    accumulators of its 16 rows, one 16 x 8 tile after another along N. Asynchronous: issue
    after `warpgroup.fence()`, then `warpgroup.commit_group()` and `wait_group` before D is
    read."""
    count = len(acc)
    outs = ", ".join(f"${i}" for i in range(count))
    text = (f"{{\n.reg .pred p;\nsetp.ne.b32 p, ${count + 5}, 0;\n"
            f"wgmma.mma_async.sync.aligned.m64n{count * 2}k16.f32.bf16.bf16 {{{outs}}}, "
            f"{{${count}, ${count + 1}, ${count + 2}, ${count + 3}}}, ${count + 4}, p, 1, 1, 0;\n}}")
    operands = ([Int32(x).ir_value(loc=loc, ip=ip) for x in (a0, a1, a2, a3)]
                + [Int64(desc).ir_value(loc=loc, ip=ip),
                   Int32(int(accumulate)).ir_value(loc=loc, ip=ip)]
                + [Float32(x).ir_value(loc=loc, ip=ip) for x in acc])
    constraints = ",".join(["=f"] * count + ["r"] * 4 + ["l", "r"]
                           + [str(i) for i in range(count)])
    result = llvm.inline_asm(llvm.StructType.get_literal([T.f32()] * count), operands, text,
                             constraints, has_side_effects=True, is_align_stack=False,
                             asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return [Float32(llvm.extractvalue(T.f32(), result, [i], loc=loc, ip=ip))
            for i in range(count)]


@dsl_user_op
def fence_operands(values: list, *, loc=None, ip=None) -> list:
    """`values` passed through an empty asm with side effects: uses of a wgmma's results stay
    after its wait, and writes of its operands before its issue (wgmma reads and writes them
    asynchronously; the compiler does not know)."""
    count = len(values)
    result = llvm.inline_asm(llvm.StructType.get_literal([T.f32()] * count),
                             [Float32(x).ir_value(loc=loc, ip=ip) for x in values], "",
                             ",".join(["=f"] * count + [str(i) for i in range(count)]),
                             has_side_effects=True, is_align_stack=False,
                             asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return [Float32(llvm.extractvalue(T.f32(), result, [i], loc=loc, ip=ip))
            for i in range(count)]


@dsl_user_op
def bulk_copy_g2s(dst: Int32, src: Int64, size: int, barrier: Int32, *, loc=None,
                  ip=None) -> None:
    """`size` bytes (a multiple of 16) from global address src to shared address dst by the
    TMA unit, completing `size` transaction bytes on the mbarrier at shared address
    `barrier` (cp.async.bulk, no tensor map: one contiguous block)."""
    llvm.inline_asm(None, [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip),
                           Int32(barrier).ir_value(loc=loc, ip=ip)],
                    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                    f"[$0], [$1], {size}, [$2];", "r,l,r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
