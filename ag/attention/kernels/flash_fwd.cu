// FlashAttention-2 forward in float32: the CUDA twin of ag.attention.tiled_forward.
//
// O = softmax(scale · Q Kᵀ + mask) V for one (batch·head, query tile) per thread block
// (Dao, 2023, Algorithm 1): the query tile Q_i stays in shared memory, the key/value tiles
// K_j, V_j stream through it, and each row keeps a running max m_i, a running sum l_i and an
// unscaled accumulator acc in registers. One division at the end; lse = m_i + log l_i is
// written for the backward pass (flash_bwd.cu).
//
// Layout: q (B·H, Nq, d), k and v (B·Hkv, Nk, d), o (B·H, Nq, d), lse (B·H, Nq), contiguous
// row-major float32. Query head h reads key/value head h / (H / Hkv) (GQA; Hkv = 1 is MQA).
// causal: 0 none, 1 top-left (query i sees keys 0..i), 2 bottom-right (keys 0..i + Nk - Nq).
// A row that sees no key gives O = 0 and lse = -inf.
//
// Compile with -DHEAD_DIM=d, 1 <= d <= 128 (ag/attention/gpu.py builds one module per d).
// Launch: grid (ceil(Nq / 64), B·H), 128 threads, flash_fwd_f32_smem bytes of dynamic shared memory.

#ifndef HEAD_DIM
#error "compile with -DHEAD_DIM=d, 1 <= d <= 128"
#endif
static_assert(HEAD_DIM >= 1 && HEAD_DIM <= 128, "flash_fwd.cu: HEAD_DIM must be in 1..128");

#ifndef FWD_BLOCK_K  // keys per K/V tile; at d > 64 half a tile, so that two blocks' tiles fit an SM's shared memory
#define FWD_BLOCK_K (HEAD_DIM > 64 ? 32 : 64)
#endif

constexpr int BLOCK_Q = 64;                   // query rows per thread block
constexpr int BLOCK_K = FWD_BLOCK_K;          // keys per K/V tile
constexpr int TX = 16, TY = 8;                // 128 threads: TX along keys / head dim, TY along queries
constexpr int THREADS = TX * TY;
constexpr int ROWS = BLOCK_Q / TY;            // query rows per thread (ty * ROWS + r); more rows, more FMAs a shared load
constexpr int COLS = BLOCK_K / TX;            // keys per thread: tx + c * TX
constexpr int D = (HEAD_DIM + 15) / 16 * 16;  // head dim padded with zeros to a multiple of 16
constexpr int DCOLS = D / TX;                 // output columns per thread: tx + e * TX
constexpr int STRIDE = D + 4;                 // floats per shared row, padded: float4 reads down a column are conflict-free
constexpr int P_STRIDE = BLOCK_K + 4;
static_assert(BLOCK_K % TX == 0 && BLOCK_K % 4 == 0, "flash_fwd.cu: a K/V tile is whole columns of threads");

// Dynamic shared memory per block, read by ag/attention/gpu.py (RawModule.get_global)
extern "C" __constant__ int flash_fwd_f32_smem = (BLOCK_Q * STRIDE + 2 * BLOCK_K * STRIDE + BLOCK_Q * P_STRIDE) * 4;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// 16 threads of a half-warp share a query row (the same ty): reduce over them
__device__ __forceinline__ float row_max(float x) {
    for (int offset = TX / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

__device__ __forceinline__ float row_sum(float x) {
    for (int offset = TX / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// acc + a · b as four fused multiply-adds
__device__ __forceinline__ float dot4_add(float acc, float4 a, float4 b) {
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

// May query row `row` see key `col`? (causal: 0 none, 1 top-left, 2 bottom-right)
__device__ __forceinline__ bool visible(int row, int col, int n_k, int causal, int offset) {
    return col < n_k && (causal == 0 || col <= row + offset);
}

// Rows row0..row0+TILE_ROWS-1 of an (n, HEAD_DIM) matrix into a (TILE_ROWS, STRIDE) shared tile,
// zeros past row n and past column HEAD_DIM, so that boundary tiles need no other checks.
template <int TILE_ROWS>
__device__ void load_tile(float* tile, const float* __restrict__ x, int row0, int n) {
    if constexpr (HEAD_DIM % 4 == 0) {  // float4 loads: the caller passes 16-byte-aligned arrays
        constexpr int VECS = D / 4;
        for (int i = threadIdx.x; i < TILE_ROWS * VECS; i += THREADS) {
            int r = i / VECS, c = (i % VECS) * 4, row = row0 + r;
            float4 x4 = make_float4(0.f, 0.f, 0.f, 0.f);
            if (row < n && c < HEAD_DIM) x4 = *reinterpret_cast<const float4*>(x + (long long)row * HEAD_DIM + c);
            *reinterpret_cast<float4*>(tile + r * STRIDE + c) = x4;
        }
    } else {
        for (int i = threadIdx.x; i < TILE_ROWS * D; i += THREADS) {
            int r = i / D, c = i % D, row = row0 + r;
            tile[r * STRIDE + c] = (row < n && c < HEAD_DIM) ? x[(long long)row * HEAD_DIM + c] : 0.f;
        }
    }
}

// s = scale · Q_i K_jᵀ for this thread's ROWS × COLS entries, masked entries -inf
__device__ __forceinline__ void scores(float (&s)[ROWS][COLS], const float* q_s, const float* k_s, int ty, int tx,
                                       int q_start, int k_start, int n_k, float scale, int causal, int offset) {
    for (int r = 0; r < ROWS; ++r)
        for (int c = 0; c < COLS; ++c) s[r][c] = 0.f;
    for (int kk = 0; kk < D; kk += 4) {
        float4 q4[ROWS], k4[COLS];
        for (int r = 0; r < ROWS; ++r) q4[r] = *reinterpret_cast<const float4*>(q_s + (ty * ROWS + r) * STRIDE + kk);
        for (int c = 0; c < COLS; ++c) k4[c] = *reinterpret_cast<const float4*>(k_s + (tx + c * TX) * STRIDE + kk);
        for (int r = 0; r < ROWS; ++r)
            for (int c = 0; c < COLS; ++c)
                s[r][c] = dot4_add(s[r][c], q4[r], k4[c]);
    }
    for (int r = 0; r < ROWS; ++r)
        for (int c = 0; c < COLS; ++c) {
            bool seen = visible(q_start + ty * ROWS + r, k_start + tx + c * TX, n_k, causal, offset);
            s[r][c] = seen ? s[r][c] * scale : neg_inf();
        }
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)  // at least 2 blocks an SM
flash_fwd_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
              float* __restrict__ o, float* __restrict__ lse,
              int n_q, int n_k, int h, int h_kv, float scale, int causal) {
    extern __shared__ float4 smem[];
    float* q_s = reinterpret_cast<float*>(smem);  // Q_i   (BLOCK_Q, STRIDE)
    float* k_s = q_s + BLOCK_Q * STRIDE;           // K_j   (BLOCK_K, STRIDE)
    float* v_s = k_s + BLOCK_K * STRIDE;           // V_j   (BLOCK_K, STRIDE)
    float* p_s = v_s + BLOCK_K * STRIDE;           // P_ij  (BLOCK_Q, P_STRIDE)

    const int bh = blockIdx.y;                                 // b · H + query head
    const int bh_kv = (bh / h) * h_kv + (bh % h) / (h / h_kv);  // its key/value head
    const int q_start = blockIdx.x * BLOCK_Q;
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    q += (long long)bh * n_q * HEAD_DIM;
    o += (long long)bh * n_q * HEAD_DIM;
    lse += (long long)bh * n_q;
    k += (long long)bh_kv * n_k * HEAD_DIM;
    v += (long long)bh_kv * n_k * HEAD_DIM;

    const int offset = causal == 2 ? n_k - n_q : 0;
    const int q_stop = min(n_q, q_start + BLOCK_Q);
    const int k_stop = causal ? max(0, min(n_k, q_stop + offset)) : n_k;  // keys past it are masked for every row

    float m_i[ROWS], l_i[ROWS], acc[ROWS][DCOLS];
    for (int r = 0; r < ROWS; ++r) {
        m_i[r] = neg_inf();
        l_i[r] = 0.f;
        for (int e = 0; e < DCOLS; ++e) acc[r][e] = 0.f;
    }
    load_tile<BLOCK_Q>(q_s, q, q_start, n_q);

    for (int k_start = 0; k_start < k_stop; k_start += BLOCK_K) {
        __syncthreads();  // every thread is done with the previous K_j, V_j
        load_tile<BLOCK_K>(k_s, k, k_start, n_k);
        load_tile<BLOCK_K>(v_s, v, k_start, n_k);
        __syncthreads();

        float s[ROWS][COLS];
        scores(s, q_s, k_s, ty, tx, q_start, k_start, n_k, scale, causal, offset);
        for (int r = 0; r < ROWS; ++r) {
            float tile_max = s[r][0];
            for (int c = 1; c < COLS; ++c) tile_max = fmaxf(tile_max, s[r][c]);
            float m_new = fmaxf(m_i[r], row_max(tile_max));
            float shift = m_new == neg_inf() ? 0.f : m_new;  // a row with nothing visible yet
            float alpha = __expf(m_i[r] - shift);            // rescales what was summed under the old max
            float p_sum = 0.f;
            for (int c = 0; c < COLS; ++c) {
                float p = __expf(s[r][c] - shift);
                p_s[(ty * ROWS + r) * P_STRIDE + tx + c * TX] = p;
                p_sum += p;
            }
            l_i[r] = alpha * l_i[r] + row_sum(p_sum);
            for (int e = 0; e < DCOLS; ++e) acc[r][e] *= alpha;
            m_i[r] = m_new;
        }
        __syncwarp();  // a row of P is written and read by the same half-warp

        for (int kk = 0; kk < BLOCK_K; kk += 4) {  // acc += P_ij V_j
            float4 p4[ROWS];
            for (int r = 0; r < ROWS; ++r)
                p4[r] = *reinterpret_cast<const float4*>(p_s + (ty * ROWS + r) * P_STRIDE + kk);
            for (int e = 0; e < DCOLS; ++e) {
                const float* v_col = v_s + kk * STRIDE + tx + e * TX;
                float4 v4 = make_float4(v_col[0], v_col[STRIDE], v_col[2 * STRIDE], v_col[3 * STRIDE]);
                for (int r = 0; r < ROWS; ++r) acc[r][e] = dot4_add(acc[r][e], p4[r], v4);
            }
        }
    }

    for (int r = 0; r < ROWS; ++r) {
        int row = q_start + ty * ROWS + r;
        if (row >= n_q) continue;
        for (int e = 0; e < DCOLS; ++e) {
            int col = tx + e * TX;
            if (col < HEAD_DIM) o[(long long)row * HEAD_DIM + col] = l_i[r] != 0.f ? acc[r][e] / l_i[r] : 0.f;  // 0: saw nothing; NaN stays NaN
        }
        if (tx == 0) lse[row] = m_i[r] + logf(l_i[r]);  // -inf + log 0 = -inf for a row that saw nothing
    }
}
