// FlashAttention-2 forward in bfloat16 on the tensor cores: flash_fwd.cu with its two matrix
// products done by mma.sync.aligned.m16n8k16 (bf16 inputs, float32 accumulation).
//
// Same algorithm, names, masks and GQA as flash_fwd.cu: one thread block per (batch·head,
// 64-row query tile), 4 warps, each warp owning 16 query rows; m_i, l_i and acc are float32 in
// registers, m_i in log2 units (scores times log2 e, so that each exp is one ex2 instruction).
// Q_i is loaded once into registers as mma A fragments. K_j and V_j stream through two stages of
// shared memory: while the tensor cores work on tile j, cp.async copies tile j + 1 (global ->
// shared without passing through registers). Fragments come out of shared memory with ldmatrix,
// V's transposed on the way (.trans), so V_j is stored as it is in memory. S_ij comes out of the
// tensor cores in the accumulator layout, which is exactly the A-fragment layout of P_ij for the
// next product, so P never goes to shared memory (FlashAttention-2's register reuse): only its
// rounding to bf16 happens on the way.
//
// Inputs q, k, v: bf16 bit patterns (uint16 arrays), layout as in flash_fwd.cu.
// Outputs o and lse: float32 (o is not rounded to bf16; round it if a bf16 result is wanted).
// Compile with -DHEAD_DIM=d, 1 <= d <= 128, for sm_80 or newer. Launch: grid (ceil(Nq / 64), B·H),
// 128 threads, flash_fwd_bf16_smem bytes of dynamic shared memory (68 KB at d = 128).
//
// mma.m16n8k16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"),
// for lane = 4 g + t (g = groupID, t = threadID_in_group); each .b32 register holds two bf16,
// the lower column (or row, for B) in the low half:
//   A (16 × 16, row-major): a[0] = A[g][2t, 2t+1]  a[1] = A[g+8][2t, 2t+1]
//                           a[2] = A[g][2t+8, 2t+9] a[3] = A[g+8][2t+8, 2t+9]
//   B (16 × 8, column-major): b[0] = B[2t, 2t+1][g]  b[1] = B[2t+8, 2t+9][g]
//   C (16 × 8, float32):    c[0], c[1] = C[g][2t, 2t+1]  c[2], c[3] = C[g+8][2t, 2t+1]

#ifndef HEAD_DIM
#error "compile with -DHEAD_DIM=d, 1 <= d <= 128"
#endif
static_assert(HEAD_DIM >= 1 && HEAD_DIM <= 128, "flash_fwd_bf16.cu: HEAD_DIM must be in 1..128");

typedef unsigned short bf16;  // the bits of a bfloat16

constexpr int BLOCK_Q = 64;                   // query rows per thread block, 16 per warp
constexpr int BLOCK_K = 64;                   // keys per K/V tile
constexpr int WARPS = BLOCK_Q / 16;
constexpr int THREADS = WARPS * 32;
constexpr int D = (HEAD_DIM + 15) / 16 * 16;  // head dim padded with zeros to a multiple of 16
constexpr int STRIDE = D + 8;                 // bf16 per shared row of Q_i, K_j, V_j, padded: ldmatrix is conflict-free
constexpr int KEY_TILES = BLOCK_K / 8;        // n = 8 mma tiles of S_ij along the keys
constexpr int DIM_TILES = D / 8;              // n = 8 mma tiles of acc along the head dim
constexpr int TILE = BLOCK_K * STRIDE;        // bf16 per shared tile
static_assert(BLOCK_Q == BLOCK_K, "Q_i is staged through a K_j tile");
// dynamic shared memory: two stages of (K_j, V_j)
extern "C" __constant__ int flash_fwd_bf16_smem = 4 * TILE * sizeof(unsigned short);

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

constexpr float LOG2_E = 1.4426950408889634f;
constexpr float LN_2 = 0.6931471805599453f;

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

// the 4 threads of a quad (lanes 4g..4g+3) hold one pair of rows: reduce over them
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
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

// c += a b for one 16 × 8 × 16 tile: a 16 × 16 bf16, b 16 × 8 bf16, c 16 × 8 float32
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Rows row0..row0+63 of an (n, HEAD_DIM) bf16 matrix into a (64, STRIDE) shared tile, zeros past
// row n and past column HEAD_DIM: by cp.async in 16-byte pieces when rows are whole pieces (the caller
// passes 16-byte-aligned arrays; wait_copies before reading), else element by element.
__device__ void load_rows(bf16* tile, const bf16* __restrict__ x, int row0, int n) {
    if constexpr (HEAD_DIM % 8 == 0) {
        constexpr int VECS = D / 8;
        for (int i = threadIdx.x; i < 64 * VECS; i += THREADS) {
            int r = i / VECS, c = (i % VECS) * 8, row = row0 + r;
            bool inside = row < n && c < HEAD_DIM;
            copy_async_16(tile + r * STRIDE + c, inside ? x + (long long)row * HEAD_DIM + c : x, inside ? 16 : 0);
        }
    } else {
        for (int i = threadIdx.x; i < 64 * D; i += THREADS) {
            int r = i / D, c = i % D, row = row0 + r;
            tile[r * STRIDE + c] = (row < n && c < HEAD_DIM) ? x[(long long)row * HEAD_DIM + c] : bf16(0);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)  // 2 blocks an SM at d = 128 (3 would spill)
flash_fwd_bf16(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
               float* __restrict__ o, float* __restrict__ lse,
               int n_q, int n_k, int h, int h_kv, float scale, int causal) {
    extern __shared__ uint4 smem[];
    bf16* k_s = reinterpret_cast<bf16*>(smem);  // K_j of stage 0, then of stage 1 (Q_i first)
    bf16* v_s = k_s + 2 * TILE;                 // V_j of stage 0, then of stage 1

    const int bh = blockIdx.y;
    const int bh_kv = (bh / h) * h_kv + (bh % h) / (h / h_kv);
    const int q_start = blockIdx.x * BLOCK_Q;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;  // fragment coordinates (groupID, threadID_in_group)
    const int row_w = warp * 16;           // this thread's rows of the tile: row_w + g and row_w + g + 8
    q += (long long)bh * n_q * HEAD_DIM;
    o += (long long)bh * n_q * HEAD_DIM;
    lse += (long long)bh * n_q;
    k += (long long)bh_kv * n_k * HEAD_DIM;
    v += (long long)bh_kv * n_k * HEAD_DIM;

    const float scale2 = scale * LOG2_E;  // S_ij in log2 units: e^(scale · s) = 2^(scale2 · s)
    const int offset = causal == 2 ? n_k - n_q : 0;
    const int q_stop = min(n_q, q_start + BLOCK_Q);
    const int k_stop = causal ? max(0, min(n_k, q_stop + offset)) : n_k;

    if (k_stop > 0) {  // K_0, V_0 into stage 0, in flight while Q_i is read
        load_rows(k_s, k, 0, n_k);
        load_rows(v_s, v, 0, n_k);
    }
    commit_copies();
    load_rows(k_s + TILE, q, q_start, n_q);
    commit_copies();
    wait_copies<0>();
    __syncthreads();
    unsigned q_frag[D / 16][4];  // Q_i as A fragments, 16 head-dim columns each
    for (int kk = 0; kk < D / 16; ++kk)  // matrices: rows 0-7 | 8-15 of columns 0-7, then of columns 8-15
        ldmatrix_x4(q_frag[kk], k_s + TILE + (row_w + lane % 16) * STRIDE + kk * 16 + lane / 16 * 8);

    float m_i[2], l_i[2], acc[DIM_TILES][4];  // [0] is row g, [1] is row g + 8; acc in C layout
    for (int half = 0; half < 2; ++half) {
        m_i[half] = neg_inf();
        l_i[half] = 0.f;
    }
    for (int n = 0; n < DIM_TILES; ++n)
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;

    for (int k_start = 0, stage = 0; k_start < k_stop; k_start += BLOCK_K, stage ^= 1) {
        __syncthreads();  // every warp is done with the other stage (Q_i, or K_j-1 and V_j-1)
        if (k_start + BLOCK_K < k_stop) {
            load_rows(k_s + (stage ^ 1) * TILE, k, k_start + BLOCK_K, n_k);
            load_rows(v_s + (stage ^ 1) * TILE, v, k_start + BLOCK_K, n_k);
        }
        commit_copies();
        wait_copies<1>();  // this stage's K_j, V_j have landed; the next ones may still be in flight
        __syncthreads();
        const bf16* k_j = k_s + stage * TILE;
        const bf16* v_j = v_s + stage * TILE;

        float s[KEY_TILES][4];  // S_ij in C layout: s[n][e] is row g + 8 (e / 2), key n · 8 + 2t + e % 2
        for (int n = 0; n < KEY_TILES; n += 2) {
            for (int e = 0; e < 4; ++e) s[n][e] = s[n + 1][e] = 0.f;
            // B = K_jᵀ: matrices keys n·8.. | (n+1)·8.. by columns kk·16 + 0-7 | 8-15
            const bf16* key = k_j + ((n + lane / 16) * 8 + lane % 8) * STRIDE + lane / 8 % 2 * 8;
            for (int kk = 0; kk < D / 16; ++kk) {
                unsigned b[4];
                ldmatrix_x4(b, key + kk * 16);
                mma_m16n8k16(s[n], q_frag[kk], b[0], b[1]);
                mma_m16n8k16(s[n + 1], q_frag[kk], b[2], b[3]);
            }
        }
        // only tiles that reach past n_k or past the causal diagonal of the block's first row hold masked keys
        if (k_start + BLOCK_K > n_k || (causal && k_start + BLOCK_K - 1 > q_start + offset)) {
            for (int n = 0; n < KEY_TILES; ++n)
                for (int e = 0; e < 4; ++e) {
                    int row = q_start + row_w + g + 8 * (e / 2), col = k_start + n * 8 + 2 * t + e % 2;
                    s[n][e] = visible(row, col, n_k, causal, offset) ? s[n][e] * scale2 : neg_inf();
                }
        } else {
            for (int n = 0; n < KEY_TILES; ++n)
                for (int e = 0; e < 4; ++e) s[n][e] *= scale2;
        }

        for (int half = 0; half < 2; ++half) {
            float tile_max = neg_inf();
            for (int n = 0; n < KEY_TILES; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
            float m_new = fmaxf(m_i[half], quad_max(tile_max));
            float shift = m_new == neg_inf() ? 0.f : m_new;  // a row with nothing visible yet
            float alpha = exp2_fast(m_i[half] - shift);      // rescales what was summed under the old max
            float p_sum = 0.f;
            for (int n = 0; n < KEY_TILES; ++n)
                for (int e = 2 * half; e < 2 * half + 2; ++e) {
                    s[n][e] = exp2_fast(s[n][e] - shift);  // s becomes P_ij
                    p_sum += s[n][e];
                }
            l_i[half] = alpha * l_i[half] + quad_sum(p_sum);
            for (int n = 0; n < DIM_TILES; ++n) {
                acc[n][2 * half] *= alpha;
                acc[n][2 * half + 1] *= alpha;
            }
            m_i[half] = m_new;
        }

        for (int kk = 0; kk < BLOCK_K / 16; ++kk) {  // acc += P_ij V_j, 16 keys at a time
            // two C tiles of P side by side are one A fragment: no shuffle, no shared memory
            const unsigned p_frag[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                        pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                        pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            // B = V_j, transposed by ldmatrix: matrices keys kk·16 + 0-7 | 8-15 by columns n·8.. | (n+1)·8..
            const bf16* key = v_j + (kk * 16 + lane % 16) * STRIDE + lane / 16 * 8;
            for (int n = 0; n < DIM_TILES; n += 2) {
                unsigned b[4];
                ldmatrix_x4_trans(b, key + n * 8);
                mma_m16n8k16(acc[n], p_frag, b[0], b[1]);
                mma_m16n8k16(acc[n + 1], p_frag, b[2], b[3]);
            }
        }
    }

    for (int half = 0; half < 2; ++half) {
        int row = q_start + row_w + g + 8 * half;
        if (row >= n_q) continue;
        for (int n = 0; n < DIM_TILES; ++n)
            for (int j = 0; j < 2; ++j) {
                int col = n * 8 + 2 * t + j;
                if (col < HEAD_DIM)
                    o[(long long)row * HEAD_DIM + col] = l_i[half] != 0.f ? acc[n][2 * half + j] / l_i[half] : 0.f;  // NaN stays NaN
            }
        if (t == 0) lse[row] = m_i[half] * LN_2 + logf(l_i[half]);  // m_i back from log2 units
    }
}
