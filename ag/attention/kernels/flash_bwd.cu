// FlashAttention-2 backward in float32: the CUDA twin of ag.attention.tiled_backward.
//
// Given O and lse from flash_fwd.cu and the output grad dO (Dao, 2023, Algorithm 2, split in
// two passes as in the Triton tutorial, so that no two blocks write the same element and the
// result is the same bits on every run, no atomics):
//   flash_bwd_preprocess_f32  D = rowsum(dO ∘ O), one warp per row;
//   flash_bwd_dkdv_f32        one block per (batch·kv head, key tile): K_j, V_j stay in shared
//                             memory, the query tiles of every query head of the GQA group stream
//                             through; P = exp(scale · Q Kᵀ - lse) is recomputed, dV_j += Pᵀ dO_i,
//                             dS = P ∘ (dO_i V_jᵀ - D) · scale, dK_j += dSᵀ Q_i;
//   flash_bwd_dq_f32          one block per (batch·head, query tile): the key tiles stream
//                             through, dQ_i += dS K_j.
// A row with lse = -inf (it saw no key) gets P = 0, hence zero gradients.
//
// Layout as in flash_fwd.cu: q, o, do, dq (B·H, Nq, d); k, v, dk, dv (B·Hkv, Nk, d); lse, D (B·H, Nq).
// Compile with -DHEAD_DIM=d, 1 <= d <= 128. Launch: 256 threads; the dK/dV and dQ kernels take
// flash_bwd_dkdv_f32_smem and flash_bwd_dq_f32_smem bytes of dynamic shared memory.

#ifndef HEAD_DIM
#error "compile with -DHEAD_DIM=d, 1 <= d <= 128"
#endif
static_assert(HEAD_DIM >= 1 && HEAD_DIM <= 128, "flash_bwd.cu: HEAD_DIM must be in 1..128");

constexpr int BLOCK_Q = 64;                   // query rows per tile
constexpr int BLOCK_K = 64;                   // keys per tile
constexpr int TX = 16, TY = 16;               // 256 threads
constexpr int THREADS = TX * TY;
constexpr int ROWS = 4;                       // tile rows per thread: ty * ROWS + r (keys in dK/dV, queries in dQ)
constexpr int COLS = 4;                       // tile columns per thread: tx + c * TX
constexpr int D = (HEAD_DIM + 15) / 16 * 16;  // head dim padded with zeros to a multiple of 16
constexpr int DCOLS = D / TX;                 // gradient columns per thread: tx + e * TX
constexpr int STRIDE = D + 4;                 // floats per shared row, padded: float4 reads down a column are conflict-free
constexpr int P_STRIDE = 64 + 4;
static_assert(BLOCK_Q == TY * ROWS && BLOCK_K == TX * COLS && BLOCK_Q == BLOCK_K, "one 64 x 64 thread tiling");

// Dynamic shared memory per block, read by ag/attention/gpu.py (RawModule.get_global)
extern "C" __constant__ int flash_bwd_dkdv_f32_smem = (4 * 64 * STRIDE + 64 * P_STRIDE + 2 * BLOCK_Q) * 4;
extern "C" __constant__ int flash_bwd_dq_f32_smem = (4 * 64 * STRIDE + 64 * P_STRIDE) * 4;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// acc + a · b as four fused multiply-adds
__device__ __forceinline__ float dot4_add(float acc, float4 a, float4 b) {
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

__device__ __forceinline__ bool visible(int row, int col, int n_k, int causal, int offset) {
    return col < n_k && (causal == 0 || col <= row + offset);
}

// Rows row0..row0+63 of an (n, HEAD_DIM) matrix into a (64, STRIDE) shared tile, zeros past row n
// and past column HEAD_DIM.
__device__ void load_tile(float* tile, const float* __restrict__ x, int row0, int n) {
    if constexpr (HEAD_DIM % 4 == 0) {  // float4 loads: the caller passes 16-byte-aligned arrays
        constexpr int VECS = D / 4;
        for (int i = threadIdx.x; i < 64 * VECS; i += THREADS) {
            int r = i / VECS, c = (i % VECS) * 4, row = row0 + r;
            float4 x4 = make_float4(0.f, 0.f, 0.f, 0.f);
            if (row < n && c < HEAD_DIM) x4 = *reinterpret_cast<const float4*>(x + (long long)row * HEAD_DIM + c);
            *reinterpret_cast<float4*>(tile + r * STRIDE + c) = x4;
        }
    } else {
        for (int i = threadIdx.x; i < 64 * D; i += THREADS) {
            int r = i / D, c = i % D, row = row0 + r;
            tile[r * STRIDE + c] = (row < n && c < HEAD_DIM) ? x[(long long)row * HEAD_DIM + c] : 0.f;
        }
    }
}

// out[r][c] = a_s[ty·ROWS + r] · b_s[tx + c·TX]: this thread's entries of A Bᵀ for two (64, STRIDE) tiles
__device__ __forceinline__ void dot_rows(float (&out)[ROWS][COLS], const float* a_s, const float* b_s, int ty, int tx) {
    for (int r = 0; r < ROWS; ++r)
        for (int c = 0; c < COLS; ++c) out[r][c] = 0.f;
    for (int kk = 0; kk < D; kk += 4) {
        float4 a4[ROWS], b4[COLS];
        for (int r = 0; r < ROWS; ++r) a4[r] = *reinterpret_cast<const float4*>(a_s + (ty * ROWS + r) * STRIDE + kk);
        for (int c = 0; c < COLS; ++c) b4[c] = *reinterpret_cast<const float4*>(b_s + (tx + c * TX) * STRIDE + kk);
        for (int r = 0; r < ROWS; ++r)
            for (int c = 0; c < COLS; ++c)
                out[r][c] = dot4_add(out[r][c], a4[r], b4[c]);
    }
}

// acc[r][e] += Σ_j w_s[ty·ROWS + r][j] · x_s[j][tx + e·TX]: this thread's entries of W X for a
// (64, P_STRIDE) weight tile and a (64, STRIDE) tile. Rows of w_s are written and read by one half-warp.
__device__ __forceinline__ void add_product(float (&acc)[ROWS][DCOLS], const float* w_s, const float* x_s,
                                            int ty, int tx) {
    for (int j = 0; j < 64; j += 4) {
        float4 w4[ROWS];
        for (int r = 0; r < ROWS; ++r) w4[r] = *reinterpret_cast<const float4*>(w_s + (ty * ROWS + r) * P_STRIDE + j);
        for (int e = 0; e < DCOLS; ++e) {
            const float* x_col = x_s + j * STRIDE + tx + e * TX;
            float4 x4 = make_float4(x_col[0], x_col[STRIDE], x_col[2 * STRIDE], x_col[3 * STRIDE]);
            for (int r = 0; r < ROWS; ++r) acc[r][e] = dot4_add(acc[r][e], w4[r], x4);
        }
    }
}

// Rows row0.. of this thread's (ROWS, D) accumulator to an (n, HEAD_DIM) matrix, bounds-checked
__device__ __forceinline__ void store_rows(float* __restrict__ x, const float (&acc)[ROWS][DCOLS], int row0, int n,
                                           int ty, int tx) {
    for (int r = 0; r < ROWS; ++r) {
        int row = row0 + ty * ROWS + r;
        if (row >= n) continue;
        for (int e = 0; e < DCOLS; ++e) {
            int col = tx + e * TX;
            if (col < HEAD_DIM) x[(long long)row * HEAD_DIM + col] = acc[r][e];
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
flash_bwd_preprocess_f32(const float* __restrict__ o, const float* __restrict__ d_o, float* __restrict__ D_out,
                         long long rows) {
    const int lane = threadIdx.x % 32;
    const long long row = (long long)blockIdx.x * (THREADS / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    float sum = 0.f;
    for (int c = lane; c < HEAD_DIM; c += 32) sum += d_o[row * HEAD_DIM + c] * o[row * HEAD_DIM + c];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) D_out[row] = sum;
}

extern "C" __global__ void __launch_bounds__(THREADS)
flash_bwd_dkdv_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                   const float* __restrict__ d_o, const float* __restrict__ lse, const float* __restrict__ D,
                   float* __restrict__ dk, float* __restrict__ dv,
                   int n_q, int n_k, int h, int h_kv, float scale, int causal) {
    extern __shared__ float4 smem[];
    float* k_s = reinterpret_cast<float*>(smem);  // K_j   (BLOCK_K, STRIDE)
    float* v_s = k_s + 64 * STRIDE;                // V_j   (BLOCK_K, STRIDE)
    float* q_s = v_s + 64 * STRIDE;                // Q_i   (BLOCK_Q, STRIDE)
    float* do_s = q_s + 64 * STRIDE;               // dO_i  (BLOCK_Q, STRIDE)
    float* p_s = do_s + 64 * STRIDE;               // Pᵀ, then dSᵀ  (BLOCK_K, P_STRIDE)
    float* lse_s = p_s + 64 * P_STRIDE;            // (BLOCK_Q,)
    float* D_s = lse_s + BLOCK_Q;                  // (BLOCK_Q,)

    const int bh_kv = blockIdx.y;  // b · Hkv + key/value head
    const int group = h / h_kv;
    const int k_start = blockIdx.x * BLOCK_K;
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;  // this thread: keys ty·ROWS + r, queries tx + c·TX
    k += (long long)bh_kv * n_k * HEAD_DIM;
    v += (long long)bh_kv * n_k * HEAD_DIM;

    const int offset = causal == 2 ? n_k - n_q : 0;
    const int first_row = causal ? max(0, k_start - offset) : 0;  // the first query row that sees key k_start
    const int q_first = first_row - first_row % BLOCK_Q;

    float dk_acc[ROWS][DCOLS], dv_acc[ROWS][DCOLS];
    for (int r = 0; r < ROWS; ++r)
        for (int e = 0; e < DCOLS; ++e) dk_acc[r][e] = dv_acc[r][e] = 0.f;
    load_tile(k_s, k, k_start, n_k);
    load_tile(v_s, v, k_start, n_k);

    for (int g = 0; g < group; ++g) {  // the query heads that share this key/value head
        const long long bh = (long long)(bh_kv / h_kv) * h + (bh_kv % h_kv) * group + g;
        const float* q_h = q + bh * n_q * HEAD_DIM;
        const float* do_h = d_o + bh * n_q * HEAD_DIM;
        for (int q_start = q_first; q_start < n_q; q_start += BLOCK_Q) {
            __syncthreads();  // every thread is done with the previous Q_i, dO_i
            load_tile(q_s, q_h, q_start, n_q);
            load_tile(do_s, do_h, q_start, n_q);
            if (threadIdx.x < BLOCK_Q) {
                int row = q_start + threadIdx.x;
                float l = row < n_q ? lse[bh * n_q + row] : neg_inf();
                lse_s[threadIdx.x] = l == neg_inf() ? -l : l;  // a row that saw nothing: P = exp(-inf) = 0
                D_s[threadIdx.x] = row < n_q ? D[bh * n_q + row] : 0.f;
            }
            __syncthreads();

            float p[ROWS][COLS];  // Pᵀ: rows are keys, columns are queries
            dot_rows(p, k_s, q_s, ty, tx);
            for (int r = 0; r < ROWS; ++r)
                for (int c = 0; c < COLS; ++c) {
                    int col = tx + c * TX;
                    bool seen = visible(q_start + col, k_start + ty * ROWS + r, n_k, causal, offset);
                    p[r][c] = seen ? __expf(p[r][c] * scale - lse_s[col]) : 0.f;
                    p_s[(ty * ROWS + r) * P_STRIDE + col] = p[r][c];
                }
            __syncwarp();
            add_product(dv_acc, p_s, do_s, ty, tx);  // dV_j += Pᵀ dO_i

            float dp[ROWS][COLS];  // dPᵀ = V_j dO_iᵀ
            dot_rows(dp, v_s, do_s, ty, tx);
            __syncwarp();  // the half-warp is done reading Pᵀ before it becomes dSᵀ
            for (int r = 0; r < ROWS; ++r)
                for (int c = 0; c < COLS; ++c) {
                    int col = tx + c * TX;
                    p_s[(ty * ROWS + r) * P_STRIDE + col] = p[r][c] * (dp[r][c] - D_s[col]) * scale;
                }
            __syncwarp();
            add_product(dk_acc, p_s, q_s, ty, tx);  // dK_j += dSᵀ Q_i
        }
    }
    store_rows(dk + (long long)bh_kv * n_k * HEAD_DIM, dk_acc, k_start, n_k, ty, tx);
    store_rows(dv + (long long)bh_kv * n_k * HEAD_DIM, dv_acc, k_start, n_k, ty, tx);
}

extern "C" __global__ void __launch_bounds__(THREADS)
flash_bwd_dq_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                 const float* __restrict__ d_o, const float* __restrict__ lse, const float* __restrict__ D,
                 float* __restrict__ dq,
                 int n_q, int n_k, int h, int h_kv, float scale, int causal) {
    extern __shared__ float4 smem[];
    float* q_s = reinterpret_cast<float*>(smem);  // Q_i   (BLOCK_Q, STRIDE)
    float* do_s = q_s + 64 * STRIDE;               // dO_i  (BLOCK_Q, STRIDE)
    float* k_s = do_s + 64 * STRIDE;               // K_j   (BLOCK_K, STRIDE)
    float* v_s = k_s + 64 * STRIDE;                // V_j   (BLOCK_K, STRIDE)
    float* ds_s = v_s + 64 * STRIDE;               // dS    (BLOCK_Q, P_STRIDE)

    const int bh = blockIdx.y;
    const int bh_kv = (bh / h) * h_kv + (bh % h) / (h / h_kv);
    const int q_start = blockIdx.x * BLOCK_Q;
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;  // this thread: queries ty·ROWS + r, keys tx + c·TX
    q += (long long)bh * n_q * HEAD_DIM;
    d_o += (long long)bh * n_q * HEAD_DIM;
    k += (long long)bh_kv * n_k * HEAD_DIM;
    v += (long long)bh_kv * n_k * HEAD_DIM;

    const int offset = causal == 2 ? n_k - n_q : 0;
    const int q_stop = min(n_q, q_start + BLOCK_Q);
    const int k_stop = causal ? max(0, min(n_k, q_stop + offset)) : n_k;

    float lse_r[ROWS], D_r[ROWS], dq_acc[ROWS][DCOLS];
    for (int r = 0; r < ROWS; ++r) {
        int row = q_start + ty * ROWS + r;
        float l = row < n_q ? lse[(long long)bh * n_q + row] : neg_inf();
        lse_r[r] = l == neg_inf() ? -l : l;  // a row that saw nothing: P = 0
        D_r[r] = row < n_q ? D[(long long)bh * n_q + row] : 0.f;
        for (int e = 0; e < DCOLS; ++e) dq_acc[r][e] = 0.f;
    }
    load_tile(q_s, q, q_start, n_q);
    load_tile(do_s, d_o, q_start, n_q);

    for (int k_start = 0; k_start < k_stop; k_start += BLOCK_K) {
        __syncthreads();  // every thread is done with the previous K_j, V_j
        load_tile(k_s, k, k_start, n_k);
        load_tile(v_s, v, k_start, n_k);
        __syncthreads();

        float p[ROWS][COLS], dp[ROWS][COLS];
        dot_rows(p, q_s, k_s, ty, tx);    // S = Q_i K_jᵀ
        dot_rows(dp, do_s, v_s, ty, tx);  // dP = dO_i V_jᵀ
        for (int r = 0; r < ROWS; ++r)
            for (int c = 0; c < COLS; ++c) {
                int col = tx + c * TX;
                bool seen = visible(q_start + ty * ROWS + r, k_start + col, n_k, causal, offset);
                float p_rc = seen ? __expf(p[r][c] * scale - lse_r[r]) : 0.f;
                ds_s[(ty * ROWS + r) * P_STRIDE + col] = p_rc * (dp[r][c] - D_r[r]) * scale;
            }
        __syncwarp();
        add_product(dq_acc, ds_s, k_s, ty, tx);  // dQ_i += dS K_j
    }
    store_rows(dq + (long long)bh * n_q * HEAD_DIM, dq_acc, q_start, n_q, ty, tx);
}
