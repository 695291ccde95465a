// A barrier for layer.cpp's team that spins briefly, then sleeps.
//
// A forward's parts meet ~240 times, each wait a few microseconds on an idle machine: sleeping at every
// one (OpenMP's barrier under OMP_WAIT_POLICY=PASSIVE, which specdec sets so that idle pools do not spin
// against other processes) costs a futex wake-up each, ~7 ms a forward; spinning without a bound (ACTIVE)
// burns a core whenever the other part is descheduled on a busy machine. So: spin up to SPIN_NS, then sleep
// on a futex until the last part arrives and wakes the sleepers.
#pragma once
#include <immintrin.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>

namespace specdec_team {

class Barrier {
 public:
  static constexpr int64_t SPIN_NS = 50000;

  // Every part says the team's size before its first wait (all say the same).
  void set_parts(int parts) { parts_.store(parts, std::memory_order_relaxed); }

  void wait() {
    const int generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == parts_.load(std::memory_order_relaxed)) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) futex(FUTEX_WAKE_PRIVATE, INT_MAX);
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(SPIN_NS);
    for (int i = 1;; ++i) {
      if (generation_.load(std::memory_order_acquire) != generation) return;
      _mm_pause();
      if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);  // then re-check: the last part either sees us or we it
    while (generation_.load(std::memory_order_seq_cst) == generation) futex(FUTEX_WAIT_PRIVATE, generation);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  long futex(int op, int value) {
    return syscall(SYS_futex, reinterpret_cast<int*>(&generation_), op, value, nullptr, nullptr, 0);
  }

  std::atomic<int> parts_{1}, arrived_{0}, generation_{0}, sleepers_{0};
  static_assert(sizeof(std::atomic<int>) == sizeof(int), "the futex word is the atomic's int");
};

}  // namespace specdec_team
