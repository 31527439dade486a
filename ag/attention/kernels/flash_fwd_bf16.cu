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

#include "bf16_mma.cuh"

// dynamic shared memory: two stages of (K_j, V_j)
extern "C" __constant__ int flash_fwd_bf16_smem = 4 * TILE * sizeof(bf16);
constexpr float LN_2 = 0.6931471805599453f;  // lse back from log2 units

// the 4 threads of a quad (lanes 4g..4g+3) hold one pair of rows: reduce over them
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
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
    const int q_start = blockIdx.x * BLOCK;
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
    const int q_stop = min(n_q, q_start + BLOCK);
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
    // Q_i as A fragments, 16 head-dim columns each. The forward writes out the addresses that load_a,
    // load_b_of_transpose and load_b compute: through them ptxas gives it 207 registers at d = 128, not 173
    unsigned q_frag[D / 16][4];
    for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(q_frag[kk], k_s + TILE + (row_w + lane % 16) * STRIDE + kk * 16 + lane / 16 * 8);

    float m_i[2], l_i[2], acc[DIM_TILES][4];  // [0] is row g, [1] is row g + 8; acc in C layout
    for (int half = 0; half < 2; ++half) {
        m_i[half] = neg_inf();
        l_i[half] = 0.f;
    }
    for (int n = 0; n < DIM_TILES; ++n)
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;

    for (int k_start = 0, stage = 0; k_start < k_stop; k_start += BLOCK, stage ^= 1) {
        __syncthreads();  // every warp is done with the other stage (Q_i, or K_j-1 and V_j-1)
        if (k_start + BLOCK < k_stop) {
            load_rows(k_s + (stage ^ 1) * TILE, k, k_start + BLOCK, n_k);
            load_rows(v_s + (stage ^ 1) * TILE, v, k_start + BLOCK, n_k);
        }
        commit_copies();
        wait_copies<1>();  // this stage's K_j, V_j have landed; the next ones may still be in flight
        __syncthreads();
        const bf16* k_j = k_s + stage * TILE;
        const bf16* v_j = v_s + stage * TILE;

        float s[ROW_TILES][4];  // S_ij in C layout: s[n][e] is row g + 8 (e / 2), key n · 8 + 2t + e % 2
        for (int n = 0; n < ROW_TILES; n += 2) {
            for (int e = 0; e < 4; ++e) s[n][e] = s[n + 1][e] = 0.f;
            // B = K_jᵀ: matrices keys n·8.. | (n+1)·8.. by columns kk·16 + 0-7 | 8-15 (load_b_of_transpose's)
            const bf16* key = k_j + ((n + lane / 16) * 8 + lane % 8) * STRIDE + lane / 8 % 2 * 8;
            for (int kk = 0; kk < D / 16; ++kk) {
                unsigned b[4];
                ldmatrix_x4(b, key + kk * 16);
                mma_m16n8k16(s[n], q_frag[kk], b[0], b[1]);
                mma_m16n8k16(s[n + 1], q_frag[kk], b[2], b[3]);
            }
        }
        // only tiles that reach past n_k or past the causal diagonal of the block's first row hold masked keys
        if (k_start + BLOCK > n_k || (causal && k_start + BLOCK - 1 > q_start + offset)) {
            for (int n = 0; n < ROW_TILES; ++n)
                for (int e = 0; e < 4; ++e) {
                    int row = q_start + row_w + g + 8 * (e / 2), col = k_start + n * 8 + 2 * t + e % 2;
                    s[n][e] = visible(row, col, n_k, causal, offset) ? s[n][e] * scale2 : neg_inf();
                }
        } else {
            for (int n = 0; n < ROW_TILES; ++n)
                for (int e = 0; e < 4; ++e) s[n][e] *= scale2;
        }

        for (int half = 0; half < 2; ++half) {
            float tile_max = neg_inf();
            for (int n = 0; n < ROW_TILES; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
            float m_new = fmaxf(m_i[half], quad_max(tile_max));
            float shift = m_new == neg_inf() ? 0.f : m_new;  // a row with nothing visible yet
            float alpha = exp2_fast(m_i[half] - shift);      // rescales what was summed under the old max
            float p_sum = 0.f;
            for (int n = 0; n < ROW_TILES; ++n)
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

        for (int kk = 0; kk < BLOCK / 16; ++kk) {  // acc += P_ij V_j, 16 keys at a time
            unsigned p_frag[4];  // two C tiles of P side by side are one A fragment: no shared memory
            to_a_fragment(p_frag, s[2 * kk], s[2 * kk + 1]);
            // B = V_j, transposed by ldmatrix: matrices keys kk·16 + 0-7 | 8-15 by columns n·8.. | (n+1)·8.. (load_b's)
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
