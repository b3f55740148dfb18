// Entry points of the backward, both families: the workspace size and the dispatch from (dtype,
// head_dim) to the instantiation built in sm80/bwd_hdim<N>_<dtype>.cu or, for the Hopper main kernel
// (head dims 64, 128, 192 and 256), sm90/bwd_hdim<N>_<dtype>.cu (pruned by FLASHATTN_CUDA_HEAD_DIMS). Both take
// the same BwdParams and workspace; only block_m (the deterministic semaphores) and block_n differ.
//
// Workspace (each part 256-byte aligned), all of it O(seqlen_q), none O(seqlen_q * seqlen_k):
//   D = rowsum(dO * O)   fp32 (num_heads, rows_q)
//   dQ accumulator       fp32 (num_heads, rows_q, kernel head_dim)
//   semaphores           int32 (batch, num_heads, q-blocks, split_d), deterministic mode only
//   tail dK, dV sums     fp32 (R, 2, block_n, kernel head_dim) and R counters: the last wave's R split tasks
//                        (tail_split; R < the GPU's SM count: at most 131 slots of 128 KiB = 17.2 MB at
//                        head_dim 128 on an H100)
// with rows_q = total_q (varlen) or batch * seqlen_q. GQA needs nothing more: a CTA sums dK, dV over
// its kv head's group of query heads in registers.
#include "common/layout.hpp"
#include "cuda/common.cuh"
#include "cuda/kernels.hpp"
#include "cuda/sm80/bwd_config.cuh"
#include "cuda/sm80/bwd_tail_split.hpp"
#include "cuda/sm80/mma.cuh"

namespace flashattn::sm80 {

template <class T, int kHeadDim>
Status run_bwd(const BwdParams& bp, cudaStream_t stream, int32_t num_semaphores);

}  // namespace flashattn::sm80

namespace flashattn::cuda::sm90 {
template <class T, int kHeadDim>
Status run_bwd(const sm80::BwdParams& bp, cudaStream_t stream, int32_t num_semaphores);
}  // namespace flashattn::cuda::sm90

namespace flashattn::sm80 {
namespace {

using RunBwd = Status (*)(const BwdParams&, cudaStream_t, int32_t);
struct BwdKernels {
  int head_dim;
  RunBwd fp16, bf16;
};
// The Hopper main kernel's instantiations (sm_90a, built beside the sm90 forward).
constexpr BwdKernels kSm90BwdKernels[] = {
#if FLASHATTN_HAVE_SM90 && defined(FLASHATTN_HDIM_64)
    {64, &cuda::sm90::run_bwd<__half, 64>, &cuda::sm90::run_bwd<__nv_bfloat16, 64>},
#endif
#if FLASHATTN_HAVE_SM90 && defined(FLASHATTN_HDIM_128)
    {128, &cuda::sm90::run_bwd<__half, 128>, &cuda::sm90::run_bwd<__nv_bfloat16, 128>},
#endif
#if FLASHATTN_HAVE_SM90 && defined(FLASHATTN_HDIM_192)
    {192, &cuda::sm90::run_bwd<__half, 192>, &cuda::sm90::run_bwd<__nv_bfloat16, 192>},
#endif
#if FLASHATTN_HAVE_SM90 && defined(FLASHATTN_HDIM_256)
    {256, &cuda::sm90::run_bwd<__half, 256>, &cuda::sm90::run_bwd<__nv_bfloat16, 256>},
#endif
    {0, nullptr, nullptr},
};
// The instantiations this build has (the sentinel keeps the table non-empty).
constexpr BwdKernels kBwdKernels[] = {
#if defined(FLASHATTN_HDIM_32)
    {32, &run_bwd<__half, 32>, &run_bwd<__nv_bfloat16, 32>},
#endif
#if defined(FLASHATTN_HDIM_64)
    {64, &run_bwd<__half, 64>, &run_bwd<__nv_bfloat16, 64>},
#endif
#if defined(FLASHATTN_HDIM_96)
    {96, &run_bwd<__half, 96>, &run_bwd<__nv_bfloat16, 96>},
#endif
#if defined(FLASHATTN_HDIM_128)
    {128, &run_bwd<__half, 128>, &run_bwd<__nv_bfloat16, 128>},
#endif
#if defined(FLASHATTN_HDIM_192)
    {192, &run_bwd<__half, 192>, &run_bwd<__nv_bfloat16, 192>},
#endif
#if defined(FLASHATTN_HDIM_256)
    {256, &run_bwd<__half, 256>, &run_bwd<__nv_bfloat16, 256>},
#endif
    {0, nullptr, nullptr},
};

constexpr size_t align256(size_t n) { return (n + 255) / 256 * 256; }

struct BwdWorkspace {
  int kernel_head_dim = 0;
  int64_t rows_q = 0;
  int32_t num_m_blocks = 0, num_semaphores = 0;
  int block_n = 0;  // the main kernel's
  TailSplit tail;
  int persistent_ctas = 0;  // the Hopper kernel's grid: the SMs where persistent_tasks, else 0 (a CTA a task)
  int64_t tail_floats = 0;
  size_t d_sum = 0, dq_accum = 0, semaphore = 0, tail_dkv = 0, tail_done = 0, total = 0;  // byte offsets, total size
};

// The kernel head_dim of p's head_dim in the Hopper or the sm80 family (0: none).
int family_kernel_head_dim(const fa_params& p, bool hopper) {
  return hopper ? sm90_bwd_kernel_head_dim(p.head_dim) : bwd_kernel_head_dim(p.head_dim);
}

// Whether the Hopper backward takes p's ALiBi: its wide kernel (192, 256) does, bwd_ws_kernel does not.
bool hopper_alibi(const fa_params& p) { return sm90_bwd_config(sm90_bwd_kernel_head_dim(p.head_dim)).wide != 0; }

// hopper: the layout for the sm90 main kernel (its block_m, no d split).
BwdWorkspace workspace_layout(const fa_params& p, bool hopper, int num_sms) {
  BwdWorkspace w;
  w.kernel_head_dim = family_kernel_head_dim(p, hopper);
  if (w.kernel_head_dim == 0 || p.batch <= 0) return w;
  const BwdConfig c = bwd_config(w.kernel_head_dim);
  const int block_m = hopper ? sm90_bwd_config(w.kernel_head_dim).block_m : c.block_m, split_d = hopper ? 1 : c.split_d;
  w.rows_q = is_varlen(p) ? p.total_q : int64_t(p.batch) * p.seqlen_q;
  w.num_m_blocks = (p.seqlen_q + block_m - 1) / block_m;
  w.num_semaphores = p.deterministic ? p.batch * p.num_heads * w.num_m_blocks * split_d : 0;
  w.block_n = hopper ? sm90_bwd_config(w.kernel_head_dim).block_n : c.block_n;
  w.tail = tail_split(p, block_m, w.block_n, hopper || c.layout == 1, num_sms,
                      hopper ? kSm90BwdPieceCost : kBwdPieceCost);
  w.persistent_ctas = hopper && num_sms > 0 && persistent_tasks(p, block_m, kSm90BwdPersistentIters) ? num_sms : 0;
  w.tail_floats = int64_t(w.tail.split) * 2 * w.block_n * w.kernel_head_dim;
  w.d_sum = 0;
  w.dq_accum = align256(sizeof(float) * size_t(p.num_heads) * size_t(w.rows_q));
  w.semaphore = w.dq_accum + align256(sizeof(float) * size_t(p.num_heads) * size_t(w.rows_q) * w.kernel_head_dim);
  w.tail_dkv = w.semaphore + align256(sizeof(int32_t) * size_t(w.num_semaphores));
  w.tail_done = w.tail_dkv + align256(sizeof(float) * size_t(w.tail_floats));
  w.total = w.tail_done + align256(sizeof(int32_t) * size_t(w.tail.split));
  return w;
}
BwdWorkspace workspace_layout(const fa_params& p, bool hopper) {
  cuda::DeviceInfo dev;
  return workspace_layout(p, hopper, cuda::device_info(&dev).ok() ? dev.num_sms : 0);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace
}  // namespace flashattn::sm80

namespace flashattn::cuda {

namespace {

template <size_t N>
sm80::RunBwd lookup(const sm80::BwdKernels (&table)[N], int kernel_head_dim, fa_dtype dtype) {
  for (const sm80::BwdKernels& k : table)
    if (k.head_dim != 0 && k.head_dim == kernel_head_dim) return dtype == FA_FLOAT16 ? k.fp16 : k.bf16;
  return nullptr;
}

// The instantiation of this family for p's (dtype, kernel head_dim), null when not built.
sm80::RunBwd find_bwd(const fa_params& p, bool hopper) {
  const int kernel_head_dim = sm80::family_kernel_head_dim(p, hopper);
  if (p.dtype != FA_FLOAT16 && p.dtype != FA_BFLOAT16) return nullptr;
  return hopper ? lookup(sm80::kSm90BwdKernels, kernel_head_dim, p.dtype)
                : lookup(sm80::kBwdKernels, kernel_head_dim, p.dtype);
}

Status backward(const fa_params& p, bool hopper) {
  using namespace sm80;
  const char* name = hopper ? "flashattn-sm90" : "flashattn-sm80";
  if (p.dtype != FA_FLOAT16 && p.dtype != FA_BFLOAT16)
    return unsupported("%s backward supports fp16 and bf16 (got %s)", name, fa_dtype_name(p.dtype));
  const BwdWorkspace w = workspace_layout(p, hopper);
  if (w.kernel_head_dim == 0 && hopper)
    return unsupported("flashattn-sm90 backward: head_dim %d: it takes 33..256 (flashattn-sm80 1..256)", p.head_dim);
  if (w.kernel_head_dim == 0) return unsupported("%s backward: head_dim %d exceeds 256", name, p.head_dim);
  const RunBwd run = find_bwd(p, hopper);
  if (!run)
    return unsupported("%s backward: head_dim %d (kernel %d) was not built (FLASHATTN_CUDA_HEAD_DIMS)", name,
                       p.head_dim, w.kernel_head_dim);
  if (p.batch == 0 || p.seqlen_q + p.seqlen_k == 0) return {};
  FA_RETURN_IF_ERROR(require_workspace(p, w.total, hopper ? "flashattn-sm90 backward" : "flashattn-sm80 backward"));
  if (w.total > 0 && !aligned16(p.workspace))  // the dQ accumulator is zeroed with 16-byte stores
    return {FA_ERROR_WORKSPACE,
            format("workspace: %s backward needs 16-byte aligned device memory (got %p)", name, p.workspace)};

  BwdParams bp{};
  bp.q = p.q, bp.k = p.k, bp.v = p.v, bp.o = p.o, bp.dout = p.dout;
  bp.dq = p.dq, bp.dk = p.dk, bp.dv = p.dv, bp.lse = p.lse;
  bp.q_batch_stride = p.q_batch_stride, bp.q_row_stride = p.q_row_stride, bp.q_head_stride = p.q_head_stride;
  bp.k_batch_stride = p.k_batch_stride, bp.k_row_stride = p.k_row_stride, bp.k_head_stride = p.k_head_stride;
  bp.v_batch_stride = p.v_batch_stride, bp.v_row_stride = p.v_row_stride, bp.v_head_stride = p.v_head_stride;
  bp.o_batch_stride = p.o_batch_stride, bp.o_row_stride = p.o_row_stride, bp.o_head_stride = p.o_head_stride;
  bp.do_batch_stride = p.do_batch_stride, bp.do_row_stride = p.do_row_stride, bp.do_head_stride = p.do_head_stride;
  bp.dq_batch_stride = p.dq_batch_stride, bp.dq_row_stride = p.dq_row_stride, bp.dq_head_stride = p.dq_head_stride;
  bp.dk_batch_stride = p.dk_batch_stride, bp.dk_row_stride = p.dk_row_stride, bp.dk_head_stride = p.dk_head_stride;
  bp.dv_batch_stride = p.dv_batch_stride, bp.dv_row_stride = p.dv_row_stride, bp.dv_head_stride = p.dv_head_stride;
  bp.cu_seqlens_q = p.cu_seqlens_q, bp.cu_seqlens_k = p.cu_seqlens_k;
  bp.batch = p.batch, bp.seqlen_q = p.seqlen_q, bp.seqlen_k = p.seqlen_k;
  bp.num_heads = p.num_heads, bp.num_heads_kv = p.num_heads_kv, bp.head_dim = p.head_dim;
  bp.group = p.num_heads / p.num_heads_kv;
  bp.rows_q = w.rows_q;
  bp.rows_k = is_varlen(p) ? p.total_k : int64_t(p.batch) * p.seqlen_k;
  bp.num_m_blocks = w.num_m_blocks;
  bp.softmax_scale = effective_scale(p);
  bp.scale_log2 = bp.softmax_scale * kLog2e;
  bp.softcap = p.softcap;
  bp.softcap_inv = p.softcap > 0.f ? bp.softmax_scale / p.softcap : 0.f;
  bp.alibi_slopes = p.alibi_slopes, bp.alibi_slopes_batch_stride = p.alibi_slopes_batch_stride;
  bp.dropout = DropoutMask::of(p);
  bp.causal = p.causal, bp.window_left = p.window_left, bp.window_right = p.window_right;
  bp.deterministic = p.deterministic != 0;

  // 16-byte vector loads and stores need aligned bases and strides in multiples of 8 elements.
  bool vec = p.head_dim % 8 == 0;
  const void* const pointers[] = {p.q, p.k, p.v, p.o, p.dout, p.dq, p.dk, p.dv};
  for (const void* ptr : pointers)
    vec = vec && aligned16(ptr);
  const int64_t strides[] = {p.q_row_stride,  p.q_head_stride,  p.k_row_stride,  p.k_head_stride,  p.v_row_stride,
                             p.v_head_stride, p.o_row_stride,   p.o_head_stride, p.do_row_stride, p.do_head_stride,
                             p.dq_row_stride, p.dq_head_stride, p.dk_row_stride, p.dk_head_stride, p.dv_row_stride,
                             p.dv_head_stride};
  for (int64_t s : strides) vec = vec && s % 8 == 0;
  if (!is_varlen(p))
    for (int64_t s : {p.q_batch_stride, p.k_batch_stride, p.v_batch_stride, p.o_batch_stride, p.do_batch_stride,
                      p.dq_batch_stride, p.dk_batch_stride, p.dv_batch_stride})
      vec = vec && s % 8 == 0;
  bp.vectorized = vec;

  char* ws = static_cast<char*>(p.workspace);
  bp.d_sum = reinterpret_cast<float*>(ws + w.d_sum);
  bp.dq_accum = reinterpret_cast<float*>(ws + w.dq_accum);
  bp.dq_semaphore = w.num_semaphores > 0 ? reinterpret_cast<int32_t*>(ws + w.semaphore) : nullptr;
  bp.num_n_blocks = (p.seqlen_k + w.block_n - 1) / w.block_n;
  bp.n_blocks_div = FastDivmod(bp.num_n_blocks), bp.heads_kv_div = FastDivmod(bp.num_heads_kv);
  bp.tail_begin = w.tail.tasks - w.tail.split, bp.tail_pieces = w.tail.pieces, bp.tail_tasks = w.tail.split;
  bp.tail_pieces_div = FastDivmod(bp.tail_pieces);
  bp.tail_dkv = w.tail.split > 0 ? reinterpret_cast<float*>(ws + w.tail_dkv) : nullptr;
  bp.tail_done = w.tail.split > 0 ? reinterpret_cast<int32_t*>(ws + w.tail_done) : nullptr;
  bp.tail_floats = w.tail_floats;
  bp.persistent_ctas = w.persistent_ctas;
  bp.task_group = hopper ? causal_task_group(p, w.block_n, kSm90BwdGroupMinBlocks, kSm90BwdGroupRows) : 0;
  bp.task_pairs = bp.num_heads_kv * bp.batch;
  bp.task_group_div = FastDivmod(bp.task_group * bp.num_n_blocks), bp.group_pairs_div = FastDivmod(bp.task_group);
  return run(bp, stream_of(p), w.num_semaphores);
}

}  // namespace

size_t sm80_backward_workspace(const fa_params& p) { return sm80::workspace_layout(p, false).total; }
Status sm80_backward(const fa_params& p) { return backward(p, false); }

bool sm90_backward_supports(const fa_params& p) {
  return find_bwd(p, true) != nullptr && (!p.alibi_slopes || sm80::hopper_alibi(p));
}
size_t sm90_backward_workspace(const fa_params& p) { return sm80::workspace_layout(p, true).total; }
Status sm90_backward(const fa_params& p) { return backward(p, true); }

}  // namespace flashattn::cuda
