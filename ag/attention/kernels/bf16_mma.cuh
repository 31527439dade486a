// What the bfloat16 kernels (flash_fwd_bf16.cu, flash_bwd_bf16.cu) share: the tile shapes, the
// mma.sync m16n8k16 product, the ldmatrix fragment loads, cp.async copies and bf16 rounding.
// ag/attention/gpu.py pastes this file in place of the #include before NVRTC compiles a source.
//
// Every block has 4 warps; a warp owns 16 rows of the block's 64-row tile (queries in the forward
// and the dQ pass, keys in the dK/dV pass). Tiles live in shared memory as (64, STRIDE) bf16,
// rows as in global memory, zero past the matrix's rows and past HEAD_DIM.
//
// mma.m16n8k16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"),
// for lane = 4 g + t (g = groupID, t = threadID_in_group); each .b32 register holds two bf16,
// the lower column (or row, for B) in the low half:
//   A (16 × 16, row-major): a[0] = A[g][2t, 2t+1]  a[1] = A[g+8][2t, 2t+1]
//                           a[2] = A[g][2t+8, 2t+9] a[3] = A[g+8][2t+8, 2t+9]
//   B (16 × 8, column-major): b[0] = B[2t, 2t+1][g]  b[1] = B[2t+8, 2t+9][g]
//   C (16 × 8, float32):    c[0], c[1] = C[g][2t, 2t+1]  c[2], c[3] = C[g+8][2t, 2t+1]
// Two C tiles side by side (columns 0-7, 8-15) are, rounded to bf16, exactly one A fragment: a
// product's result feeds the next product from registers (to_a_fragment).

#ifndef HEAD_DIM
#error "compile with -DHEAD_DIM=d, 1 <= d <= 128"
#endif
static_assert(HEAD_DIM >= 1 && HEAD_DIM <= 128, "the bf16 kernels take HEAD_DIM in 1..128");

typedef unsigned short bf16;  // the bits of a bfloat16

constexpr int BLOCK = 64;                     // rows per thread block's tile, and per streamed tile
constexpr int WARPS = BLOCK / 16;
constexpr int THREADS = WARPS * 32;
constexpr int D = (HEAD_DIM + 15) / 16 * 16;  // head dim padded with zeros to a multiple of 16
constexpr int STRIDE = D + 8;                 // bf16 per shared row, padded: ldmatrix is conflict-free
constexpr int TILE = BLOCK * STRIDE;          // bf16 per shared tile
constexpr int ROW_TILES = BLOCK / 8;          // n = 8 mma tiles along a tile's 64 rows
constexpr int DIM_TILES = D / 8;              // n = 8 mma tiles along the head dim

constexpr float LOG2_E = 1.4426950408889634f;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// 2^x in one instruction (2^-inf = 0, NaN stays NaN): scores are kept in log2 units, x · log2 e,
// so that each exp is this alone
__device__ __forceinline__ float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ bool visible(int row, int col, int n_k, int causal, int offset) {
    return col < n_k && (causal == 0 || col <= row + offset);
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// four 8 × 8 bf16 matrices from shared memory: lanes 8m..8m+7 give the addresses of matrix m's rows,
// and lane 4g + t gets, of matrix m, row g columns 2t, 2t+1 in r[m] (with .trans: rows 2t, 2t+1 of column g)
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const bf16* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)));
}

// The A fragment of rows row0..row0+15, columns col0..col0+15 of a shared tile
// (matrices: rows 0-7 | 8-15 of columns 0-7, then of columns 8-15)
__device__ __forceinline__ void load_a(unsigned (&a)[4], const bf16* tile, int row0, int col0) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x4(a, tile + (row0 + lane % 16) * STRIDE + col0 + lane / 16 * 8);
}

// B fragments of Xᵀ for two n-tiles, X a shared tile: n = X's rows row0..row0+7 (b[0], b[1]) and
// row0+8..row0+15 (b[2], b[3]), k = X's columns col0..col0+15 (for S = Q Kᵀ: X = K_j)
__device__ __forceinline__ void load_b_of_transpose(unsigned (&b)[4], const bf16* tile, int row0, int col0) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x4(b, tile + (row0 + lane / 16 * 8 + lane % 8) * STRIDE + col0 + lane / 8 % 2 * 8);
}

// B fragments of X itself for two n-tiles, transposed on the way by ldmatrix: k = X's rows
// row0..row0+15, n = X's columns col0..col0+7 (b[0], b[1]) and col0+8..col0+15 (b[2], b[3])
// (for acc += P V: X = V_j)
__device__ __forceinline__ void load_b(unsigned (&b)[4], const bf16* tile, int row0, int col0) {
    const int lane = threadIdx.x % 32;
    ldmatrix_x4_trans(b, tile + (row0 + lane % 16) * STRIDE + col0 + lane / 16 * 8);
}

// 16 bytes global -> shared, asynchronously; the bytes past `bytes` (0 or 16) are zero-filled
__device__ __forceinline__ void copy_async_16(bf16* to, const bf16* from, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(shared_address(to)), "l"(from), "r"(bytes));
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;"); }

// wait until at most `pending` of the committed groups of copies are still in flight
template <int pending>
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_group %0;" :: "n"(pending)); }

// two floats rounded to nearest-even bf16 and packed, lo in the low half
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// C tiles `left` and `right` (columns 0-7 and 8-15 of 16 × 16), rounded to bf16, as one A fragment
__device__ __forceinline__ void to_a_fragment(unsigned (&a)[4], const float (&left)[4], const float (&right)[4]) {
    a[0] = pack_bf16(left[0], left[1]);
    a[1] = pack_bf16(left[2], left[3]);
    a[2] = pack_bf16(right[0], right[1]);
    a[3] = pack_bf16(right[2], right[3]);
}

// c += a b for one 16 × 8 × 16 tile: a 16 × 16 bf16, b 16 × 8 bf16, c 16 × 8 float32
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Rows row0..row0+63 of an (n, HEAD_DIM) bf16 matrix into a shared tile, zeros past row n and past
// column HEAD_DIM: by cp.async in 16-byte pieces when rows are whole pieces (the caller passes
// 16-byte-aligned arrays, commits and waits before reading), else element by element.
__device__ void load_rows(bf16* tile, const bf16* __restrict__ x, int row0, int n) {
    if constexpr (HEAD_DIM % 8 == 0) {
        constexpr int VECS = D / 8;
        for (int i = threadIdx.x; i < BLOCK * VECS; i += THREADS) {
            int r = i / VECS, c = (i % VECS) * 8, row = row0 + r;
            bool inside = row < n && c < HEAD_DIM;
            copy_async_16(tile + r * STRIDE + c, inside ? x + (long long)row * HEAD_DIM + c : x, inside ? 16 : 0);
        }
    } else {
        for (int i = threadIdx.x; i < BLOCK * D; i += THREADS) {
            int r = i / D, c = i % D, row = row0 + r;
            tile[r * STRIDE + c] = (row < n && c < HEAD_DIM) ? x[(long long)row * HEAD_DIM + c] : bf16(0);
        }
    }
}

// A (16 × D) float32 accumulator in C layout, times `scale`, to rows row0.. of an (n, HEAD_DIM)
// matrix (this thread's rows row0 + g and row0 + g + 8), bounds-checked
__device__ __forceinline__ void store_rows(float* __restrict__ x, const float (&acc)[DIM_TILES][4], float scale,
                                           int row0, int n) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    for (int half = 0; half < 2; ++half) {
        int row = row0 + g + 8 * half;
        if (row >= n) continue;
        for (int j = 0; j < DIM_TILES; ++j)
            for (int e = 0; e < 2; ++e) {
                int col = j * 8 + 2 * t + e;
                if (col < HEAD_DIM) x[(long long)row * HEAD_DIM + col] = acc[j][2 * half + e] * scale;
            }
    }
}
