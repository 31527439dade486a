// FlashAttention-2 backward in bfloat16 on the tensor cores: flash_bwd.cu's two passes with their
// five matrix products done by mma.sync.aligned.m16n8k16 (bf16 inputs, float32 accumulation).
//
// Same split as flash_bwd.cu (the Triton tutorial's), so that no two blocks write one element and
// the gradients are the same bits on every run, no atomics. D = rowsum(dO ∘ O) comes first, from
// flash_bwd.cu's flash_bwd_preprocess_f32. Then:
//   flash_bwd_dkdv_bf16  one block per (batch·kv head, 64-key tile), a warp per 16 keys: K_j, V_j
//                        stay in shared memory while the query tiles of every query head of the
//                        GQA group stream through two cp.async stages, 32 queries at a time:
//                        Sᵀ = K_j Q_iᵀ, Pᵀ = exp(scale · Sᵀ - lse), dV_j += Pᵀ dO_i,
//                        dPᵀ = V_j dO_iᵀ, dSᵀ = Pᵀ ∘ (dPᵀ - D), dK_j += dSᵀ Q_i (times scale at the end);
//   flash_bwd_dq_bf16    one block per (batch·head, 64-query tile), a warp per 16 queries: the key
//                        tiles stream through two stages, S = Q_i K_jᵀ and dP = dO_i V_jᵀ give
//                        dS = P ∘ (dP - D), and dQ_i += dS K_j (times scale at the end).
// Pᵀ and dSᵀ (dS) leave the tensor cores in the accumulator layout and go back in as A fragments,
// rounded to bf16, without shared memory (bf16_mma.cuh). A row with lse = -inf (it saw no key)
// gets P = 0, hence zero gradients.
//
// Inputs q, k, v, do: bf16 bit patterns (uint16); lse and D float32; outputs dq, dk, dv float32.
// Layout as in flash_bwd.cu. Compile with -DHEAD_DIM=d, 1 <= d <= 128, for sm_80 or newer.
// Launch: 128 threads, flash_bwd_dkdv_bf16_smem and flash_bwd_dq_bf16_smem bytes of dynamic
// shared memory (103 KB each at d = 128).

#include "bf16_mma.cuh"

constexpr int CHUNK = 32;  // queries per step of the dK/dV pass: Sᵀ and dPᵀ of 16 keys × 32 queries in registers
constexpr int CHUNK_TILES = CHUNK / 8;
// K_j, V_j, then two stages of (Q_i, dO_i), then two stages of lse_i · log2 e and of D_i
extern "C" __constant__ int flash_bwd_dkdv_bf16_smem = 6 * TILE * sizeof(bf16) + 4 * BLOCK * sizeof(float);
// Q_i, dO_i, then two stages of (K_j, V_j)
extern "C" __constant__ int flash_bwd_dq_bf16_smem = 6 * TILE * sizeof(bf16);

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// lse of a row in log2 units, +inf for a row that saw no key or is past n_q: 2^(s - lse2) = 0 there
__device__ __forceinline__ float lse_log2(const float* __restrict__ lse, int row, int n_q) {
    float l = row < n_q ? lse[row] : neg_inf();
    return l == neg_inf() ? pos_inf() : l * LOG2_E;
}

// The two products both passes start with, over the head dim, in C layout: s = X Yᵀ and dp = U Wᵀ
// for this warp's 16 rows row_w.. of the shared tiles x and u and N · 8 rows col0.. of y and w
// (the dQ pass: X, U = Q_i, dO_i and Y, W = K_j, V_j, giving S and dP; the dK/dV pass: the
// other way round, giving Sᵀ and dPᵀ)
template <int N>
__device__ __forceinline__ void scores_and_their_grads(float (&s)[N][4], float (&dp)[N][4], const bf16* x,
                                                       const bf16* u, int row_w, const bf16* y, const bf16* w,
                                                       int col0) {
    for (int n = 0; n < N; ++n)
        for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
    for (int kk = 0; kk < DIM_TILES / 2; ++kk) {  // 16 head-dim columns at a time
        unsigned a_x[4], a_u[4], b[4];
        load_a(a_x, x, row_w, kk * 16);
        load_a(a_u, u, row_w, kk * 16);
        for (int n = 0; n < N; n += 2) {
            load_b_of_transpose(b, y, col0 + n * 8, kk * 16);
            mma_m16n8k16(s[n], a_x, b[0], b[1]);
            mma_m16n8k16(s[n + 1], a_x, b[2], b[3]);
            load_b_of_transpose(b, w, col0 + n * 8, kk * 16);
            mma_m16n8k16(dp[n], a_u, b[0], b[1]);
            mma_m16n8k16(dp[n + 1], a_u, b[2], b[3]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)  // without the 1, ptxas spills at d = 16
flash_bwd_dkdv_bf16(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                    const bf16* __restrict__ d_o, const float* __restrict__ lse, const float* __restrict__ D,
                    float* __restrict__ dk, float* __restrict__ dv,
                    int n_q, int n_k, int h, int h_kv, float scale, int causal) {
    extern __shared__ uint4 smem[];
    bf16* k_s = reinterpret_cast<bf16*>(smem);  // K_j
    bf16* v_s = k_s + TILE;                      // V_j
    bf16* q_s = v_s + TILE;                      // Q_i of stage 0, then of stage 1
    bf16* do_s = q_s + 2 * TILE;                 // dO_i of stage 0, then of stage 1
    float* lse_s = reinterpret_cast<float*>(do_s + 2 * TILE);  // lse_i · log2 e, per stage
    float* D_s = lse_s + 2 * BLOCK;                             // D_i, per stage

    const int bh_kv = blockIdx.y;  // b · Hkv + key/value head
    const int group = h / h_kv;
    const int k_start = blockIdx.x * BLOCK;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;  // fragment coordinates (groupID, threadID_in_group)
    const int row_w = warp * 16;           // this thread's keys of the tile: row_w + g and row_w + g + 8
    k += (long long)bh_kv * n_k * HEAD_DIM;
    v += (long long)bh_kv * n_k * HEAD_DIM;

    const float scale2 = scale * LOG2_E;
    const int offset = causal == 2 ? n_k - n_q : 0;
    const int first_row = causal ? max(0, k_start - offset) : 0;  // the first query row that sees key k_start
    const int q_first = first_row - first_row % BLOCK;
    const int q_tiles = q_first < n_q ? (n_q - q_first + BLOCK - 1) / BLOCK : 0;
    const int tiles = group * q_tiles;  // (query head of the group, query tile), streamed in this order

    // tile `it` of the stream into `stage`: Q_i and dO_i by cp.async, lse_i and D_i by plain loads
    auto fetch = [&](int it, int stage) {
        const long long bh = (long long)(bh_kv / h_kv) * h + (bh_kv % h_kv) * group + it / q_tiles;
        const int q_start = q_first + it % q_tiles * BLOCK;
        load_rows(q_s + stage * TILE, q + bh * n_q * HEAD_DIM, q_start, n_q);
        load_rows(do_s + stage * TILE, d_o + bh * n_q * HEAD_DIM, q_start, n_q);
        for (int i = threadIdx.x; i < BLOCK; i += THREADS) {
            int row = q_start + i;
            lse_s[stage * BLOCK + i] = lse_log2(lse + bh * n_q, row, n_q);
            D_s[stage * BLOCK + i] = row < n_q ? D[bh * n_q + row] : 0.f;
        }
    };

    load_rows(k_s, k, k_start, n_k);
    load_rows(v_s, v, k_start, n_k);
    if (tiles > 0) fetch(0, 0);
    commit_copies();

    float dk_acc[DIM_TILES][4], dv_acc[DIM_TILES][4];  // C layout: rows are this warp's 16 keys
    for (int n = 0; n < DIM_TILES; ++n)
        for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.f;

    for (int it = 0, stage = 0; it < tiles; ++it, stage ^= 1) {
        __syncthreads();  // every warp is done with the other stage
        if (it + 1 < tiles) fetch(it + 1, stage ^ 1);
        commit_copies();
        wait_copies<1>();  // this stage's Q_i, dO_i (and K_j, V_j) have landed
        __syncthreads();
        const bf16* q_i = q_s + stage * TILE;
        const bf16* do_i = do_s + stage * TILE;
        const float* lse_i = lse_s + stage * BLOCK;
        const float* D_i = D_s + stage * BLOCK;
        const int q_start = q_first + it % q_tiles * BLOCK;

        for (int c0 = 0; c0 < BLOCK; c0 += CHUNK) {  // queries c0.. of the tile
            // Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ: [n][e] is key row_w + g + 8 (e / 2), query c0 + n · 8 + 2t + e % 2
            float s[CHUNK_TILES][4], dp[CHUNK_TILES][4];
            scores_and_their_grads(s, dp, k_s, v_s, row_w, q_i, do_i, c0);
            // keys past n_k, or past the causal diagonal of the chunk's first query, are masked
            const bool edge = k_start + BLOCK > n_k || (causal && k_start + BLOCK - 1 > q_start + c0 + offset);
            for (int n = 0; n < CHUNK_TILES; ++n)
                for (int e = 0; e < 4; ++e) {
                    int col = c0 + n * 8 + 2 * t + e % 2, key = k_start + row_w + g + 8 * (e / 2);
                    bool seen = !edge || visible(q_start + col, key, n_k, causal, offset);
                    float p = seen ? exp2_fast(s[n][e] * scale2 - lse_i[col]) : 0.f;
                    s[n][e] = p;                           // Pᵀ
                    dp[n][e] = p * (dp[n][e] - D_i[col]);  // dSᵀ, without the scale
                }
            for (int kk = 0; kk < CHUNK / 16; ++kk) {  // 16 queries at a time
                unsigned a_p[4], a_ds[4], b[4];
                to_a_fragment(a_p, s[2 * kk], s[2 * kk + 1]);
                to_a_fragment(a_ds, dp[2 * kk], dp[2 * kk + 1]);
                for (int n = 0; n < DIM_TILES; n += 2) {
                    load_b(b, do_i, c0 + kk * 16, n * 8);  // dV_j += Pᵀ dO_i
                    mma_m16n8k16(dv_acc[n], a_p, b[0], b[1]);
                    mma_m16n8k16(dv_acc[n + 1], a_p, b[2], b[3]);
                    load_b(b, q_i, c0 + kk * 16, n * 8);  // dK_j += dSᵀ Q_i
                    mma_m16n8k16(dk_acc[n], a_ds, b[0], b[1]);
                    mma_m16n8k16(dk_acc[n + 1], a_ds, b[2], b[3]);
                }
            }
        }
    }
    wait_copies<0>();
    store_rows(dk + (long long)bh_kv * n_k * HEAD_DIM, dk_acc, scale, k_start + row_w, n_k);
    store_rows(dv + (long long)bh_kv * n_k * HEAD_DIM, dv_acc, 1.f, k_start + row_w, n_k);
}

extern "C" __global__ void __launch_bounds__(THREADS)
flash_bwd_dq_bf16(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                  const bf16* __restrict__ d_o, const float* __restrict__ lse, const float* __restrict__ D,
                  float* __restrict__ dq,
                  int n_q, int n_k, int h, int h_kv, float scale, int causal) {
    extern __shared__ uint4 smem[];
    bf16* q_s = reinterpret_cast<bf16*>(smem);  // Q_i
    bf16* do_s = q_s + TILE;                     // dO_i
    bf16* k_s = do_s + TILE;                     // K_j of stage 0, then of stage 1
    bf16* v_s = k_s + 2 * TILE;                  // V_j of stage 0, then of stage 1

    const int bh = blockIdx.y;
    const int bh_kv = (bh / h) * h_kv + (bh % h) / (h / h_kv);
    const int q_start = blockIdx.x * BLOCK;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int row_w = warp * 16;  // this thread's queries of the tile: row_w + g and row_w + g + 8
    q += (long long)bh * n_q * HEAD_DIM;
    d_o += (long long)bh * n_q * HEAD_DIM;
    dq += (long long)bh * n_q * HEAD_DIM;
    lse += (long long)bh * n_q;
    D += (long long)bh * n_q;
    k += (long long)bh_kv * n_k * HEAD_DIM;
    v += (long long)bh_kv * n_k * HEAD_DIM;

    const float scale2 = scale * LOG2_E;
    const int offset = causal == 2 ? n_k - n_q : 0;
    const int q_stop = min(n_q, q_start + BLOCK);
    const int k_stop = causal ? max(0, min(n_k, q_stop + offset)) : n_k;

    load_rows(q_s, q, q_start, n_q);
    load_rows(do_s, d_o, q_start, n_q);
    if (k_stop > 0) {
        load_rows(k_s, k, 0, n_k);
        load_rows(v_s, v, 0, n_k);
    }
    commit_copies();

    float lse2[2], D_r[2], dq_acc[DIM_TILES][4];  // [0] is row g, [1] is row g + 8; dq_acc in C layout
    for (int half = 0; half < 2; ++half) {
        int row = q_start + row_w + g + 8 * half;
        lse2[half] = lse_log2(lse, row, n_q);
        D_r[half] = row < n_q ? D[row] : 0.f;
    }
    for (int n = 0; n < DIM_TILES; ++n)
        for (int e = 0; e < 4; ++e) dq_acc[n][e] = 0.f;

    for (int k_start = 0, stage = 0; k_start < k_stop; k_start += BLOCK, stage ^= 1) {
        __syncthreads();  // every warp is done with the other stage
        if (k_start + BLOCK < k_stop) {
            load_rows(k_s + (stage ^ 1) * TILE, k, k_start + BLOCK, n_k);
            load_rows(v_s + (stage ^ 1) * TILE, v, k_start + BLOCK, n_k);
        }
        commit_copies();
        wait_copies<1>();  // this stage's K_j, V_j (and Q_i, dO_i) have landed
        __syncthreads();
        const bf16* k_j = k_s + stage * TILE;
        const bf16* v_j = v_s + stage * TILE;

        // S = Q_i K_jᵀ and dP = dO_i V_jᵀ: [n][e] is query row_w + g + 8 (e / 2), key k_start + n · 8 + 2t + e % 2
        float s[ROW_TILES][4], dp[ROW_TILES][4];
        scores_and_their_grads(s, dp, q_s, do_s, row_w, k_j, v_j, 0);
        const bool edge = k_start + BLOCK > n_k || (causal && k_start + BLOCK - 1 > q_start + offset);
        for (int n = 0; n < ROW_TILES; ++n)
            for (int e = 0; e < 4; ++e) {
                int row = q_start + row_w + g + 8 * (e / 2), col = k_start + n * 8 + 2 * t + e % 2;
                bool seen = !edge || visible(row, col, n_k, causal, offset);
                float p = seen ? exp2_fast(s[n][e] * scale2 - lse2[e / 2]) : 0.f;
                s[n][e] = p * (dp[n][e] - D_r[e / 2]);  // dS, without the scale
            }
        for (int kk = 0; kk < BLOCK / 16; ++kk) {  // dQ_i += dS K_j, 16 keys at a time
            unsigned a_ds[4], b[4];
            to_a_fragment(a_ds, s[2 * kk], s[2 * kk + 1]);
            for (int n = 0; n < DIM_TILES; n += 2) {
                load_b(b, k_j, kk * 16, n * 8);
                mma_m16n8k16(dq_acc[n], a_ds, b[0], b[1]);
                mma_m16n8k16(dq_acc[n + 1], a_ds, b[2], b[3]);
            }
        }
    }
    wait_copies<0>();
    store_rows(dq, dq_acc, scale, q_start + row_w, n_q);
}
