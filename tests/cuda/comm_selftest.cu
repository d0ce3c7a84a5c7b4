// Framework-free GPU self-test of the all-reduce kernels (ops/comm/comm.cuh) on ONE GPU, for the
// single-H200 round (no 2-GPU machine is lent):
//
//   1. in one process, W = 2 and 4 "ranks" whose buffers all live on this GPU, each rank's kernel
//      on its own stream (they run at once: W x 32 blocks fit on the SMs): one-shot and two-shot
//      for every dtype and sizes from 1 element to 4 Mi - 3 (8 MiB buffers), the fused all-reduce + residual +
//      RMSNorm; results against a host sum in the same order (bit-exact: float32 adds in rank
//      order, one rounding), and bit-identical across ranks. Epochs grow across all calls on the
//      same signal blocks, as in a serving process.
//      Each rank's launch captured in a CUDA graph and replayed 3 times on fresh inputs.
//   2. a barrier whose peer never comes: the kernel gives up with kBarrierTimeout, no hang.
//   3. two processes (fork before any CUDA call) on this GPU exchanging cudaIpcMemHandles through a
//      pipe: one-shot, two-shot and fused through IPC-mapped buffers (kernels of two processes
//      time-slice on one GPU, so the barriers wait across context switches: a large spin limit).
//   4. the kernel time of each algorithm at a few sizes, W = 2 on the same GPU (HBM, not NVLink:
//      not the issue's 2-GPU numbers).
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -DKILN_COMM_PROBE -gencode=arch=compute_90a,code=sm_90a \
//        -gencode=arch=compute_80,code=sm_80 -I. tests/cuda/comm_selftest.cu -o /tmp/comm_selftest &&
//        /tmp/comm_selftest
//
// Exit status 0 when every case passes; one line per case.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "ops/comm/comm_cuda.cu"

using namespace kiln;
using namespace kiln::comm;

namespace {

int failures = 0;
constexpr int64_t kMaxBytes = int64_t{8} << 20;
// Polls before a barrier gives up in the passing cases: ~10 s, far beyond a context switch (two
// processes' kernels time-slice on one GPU), short enough that a bug fails instead of hanging.
constexpr int64_t kLongSpin = int64_t{1} << 24;

#define CHECK_CUDA(x)                                                                      \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("FATAL %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

void report(bool ok, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::printf("%s ", ok ? "PASS" : "FAIL");
  std::vprintf(fmt, args);
  std::printf("\n");
  va_end(args);
  if (!ok) ++failures;
}

template <typename T>
const char* name_of() {
  if constexpr (std::is_same_v<T, float>) return "f32";
  if constexpr (std::is_same_v<T, f16_t>) return "f16";
  return "bf16";
}

template <typename T>
std::vector<T> random_input(int64_t n, unsigned seed, bool integers) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> ints(-8, 8);
  std::normal_distribution<float> normal;
  std::vector<T> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Convert<T>::from_float(integers ? float(ints(gen)) : normal(gen));
  if (n > 0) v[0] = Convert<T>::from_float(1.0f + seed % 7);
  return v;
}

template <typename T>
std::vector<T> host_sum(const std::vector<std::vector<T>>& in, int64_t n) {
  std::vector<T> out(n);
  for (int64_t i = 0; i < n; ++i) {
    float acc = Convert<T>::to_float(in[0][i]);
    for (size_t r = 1; r < in.size(); ++r) acc += Convert<T>::to_float(in[r][i]);
    out[i] = Convert<T>::from_float(acc);
  }
  return out;
}

struct Ranks {
  int world;
  std::vector<void*> data, signals, out;
  std::vector<int32_t*> error;
  std::vector<cudaStream_t> streams;

  explicit Ranks(int w) : world(w), data(w), signals(w), out(w), error(w), streams(w) {
    for (int r = 0; r < w; ++r) {
      if (!alloc_buffer(kMaxBytes, 0, &data[r]).ok() || !alloc_buffer(kSignalBytes, 0, &signals[r]).ok() ||
          !alloc_buffer(kMaxBytes, 0, &out[r]).ok() || !alloc_buffer(64, 0, reinterpret_cast<void**>(&error[r])).ok()) {
        std::printf("FATAL alloc\n");
        std::exit(2);
      }
      CHECK_CUDA(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
    }
  }

  AllReduceParams params(int r, int64_t count, Algo algo, int64_t spin = kLongSpin) const {
    AllReduceParams p{};
    for (int q = 0; q < world; ++q) {
      p.data.ptrs[q] = data[q];
      p.signals.ptrs[q] = signals[q];
    }
    p.out = out[r];
    p.rank = r;
    p.world_size = world;
    p.count = count;
    p.spin_limit = spin;
    p.error = error[r];
    p.algo = algo;
    return p;
  }
};

template <typename T>
void check_all_reduce(Ranks& R, int64_t n, Algo algo, bool integers) {
  std::vector<std::vector<T>> in(R.world);
  for (int r = 0; r < R.world; ++r) {
    in[r] = random_input<T>(n, 1000 * r + unsigned(n), integers);
    CHECK_CUDA(cudaMemcpy(R.data[r], in[r].data(), n * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(R.out[r], 0xff, n * sizeof(T)));  // poisoned: NaN in every dtype
    CHECK_CUDA(cudaMemset(R.error[r], 0, sizeof(int32_t)));
  }
  CHECK_CUDA(cudaDeviceSynchronize());  // the inputs are in place before any rank's kernel starts
  for (int r = 0; r < R.world; ++r) {
    Status s = launch_all_reduce<T>(R.params(r, n, algo), LaunchContext{R.streams[r], 0, nullptr});
    if (!s.ok()) std::printf("launch: %s\n", s.message.c_str());
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<T> want = host_sum(in, n);
  bool ok = true;
  int64_t bad = -1;
  std::vector<T> got(n), first(n);
  for (int r = 0; r < R.world; ++r) {
    int32_t err = 0;
    CHECK_CUDA(cudaMemcpy(&err, R.error[r], sizeof err, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(got.data(), R.out[r], n * sizeof(T), cudaMemcpyDeviceToHost));
    if (err != 0) ok = false;
    if (std::memcmp(got.data(), want.data(), n * sizeof(T)) != 0) {
      ok = false;
      for (int64_t i = 0; i < n && bad < 0; ++i) {
        if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) bad = i;
      }
    }
  }
  report(ok, "%s W=%d %s n=%lld %s (bit-exact vs the host sum in rank order on every rank)%s",
         algo == Algo::kOneShot ? "one-shot" : "two-shot", R.world, name_of<T>(), (long long)n,
         integers ? "integers" : "random", bad >= 0 ? " first mismatch at an element" : "");
}

template <typename T>
void check_fused(Ranks& R, int64_t rows, int64_t hidden) {
  const int64_t n = rows * hidden;
  std::vector<std::vector<T>> in(R.world);
  std::vector<T> residual0 = random_input<T>(n, 77, false), weight = random_input<T>(hidden, 78, false);
  std::vector<void*> res_dev(R.world);
  void* w_dev = nullptr;
  CHECK_CUDA(cudaMalloc(&w_dev, hidden * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(w_dev, weight.data(), hidden * sizeof(T), cudaMemcpyHostToDevice));
  for (int r = 0; r < R.world; ++r) {
    in[r] = random_input<T>(n, 500 + r, false);
    CHECK_CUDA(cudaMemcpy(R.data[r], in[r].data(), n * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&res_dev[r], n * sizeof(T)));
    CHECK_CUDA(cudaMemcpy(res_dev[r], residual0.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(R.error[r], 0, sizeof(int32_t)));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  for (int r = 0; r < R.world; ++r) {
    FusedParams f{};
    f.reduce = R.params(r, n, Algo::kOneShot);
    f.residual = res_dev[r];
    f.weight = w_dev;
    f.rows = rows;
    f.hidden = hidden;
    f.eps = 1e-6f;
    Status s = launch_fused<T>(f, LaunchContext{R.streams[r], 0, nullptr});
    if (!s.ok()) std::printf("launch: %s\n", s.message.c_str());
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  // The reference: the same roundings in double for the norm.
  const std::vector<T> sum = host_sum(in, n);
  std::vector<float> res_want(n), out_want(n);
  for (int64_t row = 0; row < rows; ++row) {
    double sq = 0;
    for (int64_t j = 0; j < hidden; ++j) {
      const int64_t i = row * hidden + j;
      res_want[i] = Convert<T>::to_float(
          Convert<T>::from_float(Convert<T>::to_float(residual0[i]) + Convert<T>::to_float(sum[i])));
      sq += double(res_want[i]) * res_want[i];
    }
    const double inv = 1.0 / std::sqrt(sq / hidden + 1e-6);
    for (int64_t j = 0; j < hidden; ++j) {
      out_want[row * hidden + j] = float(res_want[row * hidden + j] * inv * Convert<T>::to_float(weight[j]));
    }
  }
  const double tol = std::is_same_v<T, float> ? 1e-5 : std::is_same_v<T, f16_t> ? 2e-3 : 1.6e-2;
  bool ok = true, same = true;
  double worst = 0;
  std::vector<T> res_got(n), out_got(n), out_first(n);
  for (int r = 0; r < R.world; ++r) {
    int32_t err = 0;
    CHECK_CUDA(cudaMemcpy(&err, R.error[r], sizeof err, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(res_got.data(), res_dev[r], n * sizeof(T), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(out_got.data(), R.out[r], n * sizeof(T), cudaMemcpyDeviceToHost));
    ok = ok && err == 0;
    for (int64_t i = 0; i < n; ++i) {
      if (Convert<T>::to_float(res_got[i]) != res_want[i]) ok = false;
      const double e = std::fabs(Convert<T>::to_float(out_got[i]) - out_want[i]) / (std::fabs(out_want[i]) + 1e-3);
      worst = std::max(worst, e);
    }
    if (r == 0) out_first = out_got;
    same = same && std::memcmp(out_first.data(), out_got.data(), n * sizeof(T)) == 0;
    CHECK_CUDA(cudaFree(res_dev[r]));
  }
  CHECK_CUDA(cudaFree(w_dev));
  report(ok && same && worst <= 2 * tol,
         "fused W=%d %s %lld x %lld (residual bit-exact, out rel err %.2e <= %.1e, same on every rank)", R.world,
         name_of<T>(), (long long)rows, (long long)hidden, worst, 2 * tol);
}

// CUDA graphs: each rank's launch captured once into its own graph, then replayed on fresh inputs.
// The epoch lives in device memory (comm.h), so every replay is a new call; a kernel argument
// would be frozen in the graph and the second replay would pass its barriers on stale flags.
void check_graph(Ranks& R, Algo algo) {
  const int64_t n = 3000 * R.world;
  std::vector<cudaGraphExec_t> execs(R.world);
  for (int r = 0; r < R.world; ++r) {
    cudaGraph_t g;
    CHECK_CUDA(cudaStreamBeginCapture(R.streams[r], cudaStreamCaptureModeThreadLocal));
    Status s = launch_all_reduce<bf16_t>(R.params(r, n, algo), LaunchContext{R.streams[r], 0, nullptr});
    CHECK_CUDA(cudaStreamEndCapture(R.streams[r], &g));
    CHECK_CUDA(cudaGraphInstantiate(&execs[r], g, 0));
    CHECK_CUDA(cudaGraphDestroy(g));
    if (!s.ok()) std::printf("capture launch: %s\n", s.message.c_str());
  }
  bool ok = true;
  for (int replay = 0; replay < 3; ++replay) {
    std::vector<std::vector<bf16_t>> in(R.world);
    for (int r = 0; r < R.world; ++r) {
      in[r] = random_input<bf16_t>(n, 40 * replay + r, false);
      CHECK_CUDA(cudaMemcpy(R.data[r], in[r].data(), n * 2, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemset(R.out[r], 0xff, n * 2));
      CHECK_CUDA(cudaMemset(R.error[r], 0, 4));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    for (int r = 0; r < R.world; ++r) CHECK_CUDA(cudaGraphLaunch(execs[r], R.streams[r]));
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<bf16_t> want = host_sum(in, n);
    std::vector<bf16_t> got(n);
    for (int r = 0; r < R.world; ++r) {
      int32_t err = 0;
      CHECK_CUDA(cudaMemcpy(&err, R.error[r], 4, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(got.data(), R.out[r], n * 2, cudaMemcpyDeviceToHost));
      ok = ok && err == 0 && std::memcmp(got.data(), want.data(), n * 2) == 0;
    }
  }
  for (auto e : execs) CHECK_CUDA(cudaGraphExecDestroy(e));
  report(ok, "%s W=%d bf16 n=%lld captured in CUDA graphs, 3 replays on fresh inputs bit-exact",
         algo == Algo::kOneShot ? "one-shot" : "two-shot", R.world, (long long)n);
}

void check_timeout() {
  Ranks R(2);
  CHECK_CUDA(cudaMemset(R.error[0], 0, sizeof(int32_t)));
  const int64_t n = 1024;
  Status s = launch_all_reduce<bf16_t>(R.params(0, n, Algo::kOneShot, int64_t{1} << 20),
                                       LaunchContext{R.streams[0], 0, nullptr});  // rank 1 never comes
  CHECK_CUDA(cudaDeviceSynchronize());
  int32_t err = 0;
  CHECK_CUDA(cudaMemcpy(&err, R.error[0], sizeof err, cudaMemcpyDeviceToHost));
  report(s.ok() && err == kBarrierTimeout, "a peer that never arrives: the kernel returns with kBarrierTimeout (%d)",
         err);
}

void time_algos() {
  Ranks R(2);
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int64_t bytes : {int64_t{1} << 10, int64_t{256} << 10, int64_t{4} << 20}) {
    const int64_t n = bytes / 2;
    for (Algo algo : {Algo::kOneShot, Algo::kTwoShot}) {
      std::vector<float> ms;
      for (int it = 0; it < 30; ++it) {
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaEventRecord(a, R.streams[0]));
        for (int r = 0; r < 2; ++r) {
          launch_all_reduce<bf16_t>(R.params(r, n, algo), LaunchContext{R.streams[r], 0, nullptr});
        }
        CHECK_CUDA(cudaEventRecord(b, R.streams[0]));
        CHECK_CUDA(cudaDeviceSynchronize());
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      std::printf("TIME %s bf16 %lld bytes W=2 same GPU (cudaEvents on rank 0's stream, median of 30): %.2f us\n",
                  algo == Algo::kOneShot ? "one-shot" : "two-shot", (long long)bytes, ms[ms.size() / 2] * 1e3);
    }
  }
}

// Two processes on this GPU: buffers shared through cudaIpc handles sent over pipes.
int two_process_ipc() {
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return 1;
  const pid_t pid = fork();  // before any CUDA call in this process (main calls this first)
  const int rank = pid == 0 ? 1 : 0;
  // Each side keeps only its own ends, so a peer that dies is an EOF here, not a hang.
  close(rank == 0 ? to_child[0] : to_child[1]);
  close(rank == 0 ? to_parent[1] : to_parent[0]);
  const int wfd = rank == 0 ? to_child[1] : to_parent[1];
  const int rfd = rank == 0 ? to_parent[0] : to_child[0];
  void *data = nullptr, *signals = nullptr, *out = nullptr, *err_word = nullptr;
  bool ok = alloc_buffer(kMaxBytes, 0, &data).ok() && alloc_buffer(kSignalBytes, 0, &signals).ok() &&
            alloc_buffer(kMaxBytes, 0, &out).ok() && alloc_buffer(64, 0, &err_word).ok();
  IpcHandle mine[2], theirs[2];
  ok = ok && ipc_get_handle(data, 0, &mine[0]).ok() && ipc_get_handle(signals, 0, &mine[1]).ok();
  ok = ok && write(wfd, mine, sizeof mine) == sizeof mine && read(rfd, theirs, sizeof theirs) == sizeof theirs;
  void *peer_data = nullptr, *peer_signals = nullptr;
  ok = ok && ipc_open_handle(theirs[0], 0, &peer_data).ok() && ipc_open_handle(theirs[1], 0, &peer_signals).ok();
  bool peer_ok = false;
  const char* why = "";
  ok = ok && can_access_peer(0, 0, &peer_ok, &why).ok() && peer_ok;
  int passed = 0, cases = 0;
  for (Algo algo : {Algo::kOneShot, Algo::kTwoShot}) {
    for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{1} << 20}) {
      if (!ok) break;
      ++cases;
      std::vector<std::vector<bf16_t>> in = {random_input<bf16_t>(n, 11, true), random_input<bf16_t>(n, 12, true)};
      CHECK_CUDA(cudaMemcpy(data, in[rank].data(), n * 2, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemset(err_word, 0, 4));
      CHECK_CUDA(cudaDeviceSynchronize());
      AllReduceParams p{};
      p.data.ptrs[rank] = data;
      p.data.ptrs[1 - rank] = peer_data;
      p.signals.ptrs[rank] = signals;
      p.signals.ptrs[1 - rank] = peer_signals;
      p.out = out;
      p.rank = rank;
      p.world_size = 2;
      p.count = n;
      p.spin_limit = kLongSpin;
      p.error = static_cast<int32_t*>(err_word);
      p.algo = algo;
      Status s = launch_all_reduce<bf16_t>(p, LaunchContext{nullptr, 0, nullptr});
      CHECK_CUDA(cudaDeviceSynchronize());
      std::vector<bf16_t> got(n);
      CHECK_CUDA(cudaMemcpy(got.data(), out, n * 2, cudaMemcpyDeviceToHost));
      int32_t e = 0;
      CHECK_CUDA(cudaMemcpy(&e, err_word, 4, cudaMemcpyDeviceToHost));
      const std::vector<bf16_t> want = host_sum(in, n);
      passed += s.ok() && e == 0 && std::memcmp(got.data(), want.data(), n * 2) == 0;
    }
  }
  // Everyone is done reading the peer's buffers before either unmaps them.
  char token = 1;
  ok = ok && write(wfd, &token, 1) == 1 && read(rfd, &token, 1) == 1;
  if (peer_data) ipc_close_handle(peer_data, 0);
  if (peer_signals) ipc_close_handle(peer_signals, 0);
  if (pid == 0) std::_Exit(ok && passed == cases ? 0 : 1);
  int child = 0;
  waitpid(pid, &child, 0);
  report(ok && passed == cases && WIFEXITED(child) && WEXITSTATUS(child) == 0,
         "two processes on one GPU through cudaIpc handles: %d/%d one-shot and two-shot cases bit-exact on rank 0, "
         "rank 1 %s%s",
         passed, cases, WIFEXITED(child) && WEXITSTATUS(child) == 0 ? "passed" : "FAILED", ok ? "" : " (setup failed)");
  return 0;
}

}  // namespace

int main() {
  two_process_ipc();  // first: it forks before this process touches CUDA
  for (int world : {2, 4}) {
    Ranks R(world);
    for (Algo algo : {Algo::kOneShot, Algo::kTwoShot}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4096}, int64_t{(4 << 20) - 3}}) {
        check_all_reduce<bf16_t>(R, n, algo, true);
        check_all_reduce<float>(R, std::min<int64_t>(n, kMaxBytes / 4), algo, false);
      }
      check_all_reduce<f16_t>(R, 12345, algo, true);
      check_all_reduce<bf16_t>(R, 1 << 20, algo, false);
    }
    check_fused<bf16_t>(R, 1, 8192);
    check_fused<bf16_t>(R, 128, 8192);
    check_fused<float>(R, 5, 33);
    check_fused<f16_t>(R, 7, 4096);
    check_graph(R, Algo::kOneShot);
    check_graph(R, Algo::kTwoShot);
  }
  check_timeout();
  time_algos();
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "ALL PASSED", failures);
  return failures ? 1 : 0;
}
