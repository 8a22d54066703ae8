"""The reduction orders of the split DiT kernels (csrc/dit/split_reduce.h), compiled with the system C++ compiler
and run on the CPU: the split-K sums (the last-CTA fixup, its batched form, and the cluster form where rank r
reduces its slice) and the flash-decoding merge (serial, parallel, active splits only). References: float64
sums and float64 softmax attention computed here with numpy, and a float32 left-to-right loop for the order."""
import subprocess

import numpy as np
import pytest

from support.cxx_helpers import build_driver

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "dit/split_reduce.h"
using namespace flashmap::dit;
static std::vector<float> read(size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) if (std::scanf("%a", &x) != 1) std::exit(3);
  return v;
}
int main(int argc, char** argv) {
  if (!std::strcmp(argv[1], "splitk")) {  // splitk S elems ranks < partials[S][elems]
    const int S = std::atoi(argv[2]), E = std::atoi(argv[3]), R = std::atoi(argv[4]);
    const auto part = read(size_t(S) * E);
    std::vector<int> owners(E, 0);
    std::vector<float> cluster(E, 0.f);
    for (int r = 0; r < R; ++r) {
      const Slice sl = rank_slice(r, R, E);
      for (int e = sl.begin; e < sl.end; ++e) {
        ++owners[e];
        cluster[e] = sum_in_split_order_batched<kMaxClusterSplits>([&](int sp) { return part[sp * E + e]; }, S);
      }
    }
    for (int e = 0; e < E; ++e) {
      auto load = [&](int sp) { return part[sp * E + e]; };
      std::printf("%d %a %a %a\n", owners[e], sum_in_split_order(load, S),
                  sum_in_split_order_batched<16>(load, S), cluster[e]);
    }
  } else {  // merge S rows cols kv_len keys_per_split < lse[S][rows] o[S][rows][cols]
    const int S = std::atoi(argv[2]), rows = std::atoi(argv[3]), cols = std::atoi(argv[4]);
    const int active = active_splits(std::atoi(argv[5]), std::atoi(argv[6]), S);
    const auto lse = read(size_t(S) * rows), o = read(size_t(S) * rows * cols);
    for (int r = 0; r < rows; ++r) {
      for (int n : {S, active}) {
        float w[64];
        const float wsum = merge_weights([&](int s) { return lse[s * rows + r]; }, n, w);
        for (int c = 0; c < cols; ++c) {
          auto load = [&](int s) { return o[(size_t(s) * rows + r) * cols + c]; };
          float serial = 0.f;  // merge_splits' loop: the weights recomputed per element, in split order
          for (int s = 0; s < n; ++s) serial += w[s] * load(s);
          const float par = weighted_sum_in_split_order<8>([&](int s) { return w[s]; }, load, n);
          std::printf("%a %a ", wsum > 0.f ? serial / wsum : 0.f, wsum > 0.f ? par / wsum : 0.f);
        }
        std::printf("%d\n", active);
      }
    }
  }
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    exe = build_driver(tmp_path_factory, "split_reduce", DRIVER)

    def run(args, values):
        text = " ".join(float(v).hex() for v in np.asarray(values, dtype=np.float32).ravel())
        done = subprocess.run([str(exe), *map(str, args)], input=text, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return [line.split() for line in done.stdout.splitlines()]
    return run


def left_to_right(parts: np.ndarray) -> np.ndarray:
    acc = np.zeros(parts.shape[1], dtype=np.float32)
    for p in parts:
        acc = (acc + p).astype(np.float32)
    return acc


@pytest.mark.parametrize("splits,ranks", [(1, 1), (3, 3), (8, 8), (13, 8), (16, 1)])
def test_split_k_sums_cover_each_element_once_in_split_order(driver, splits, ranks):
    """elems = 16 x 128 (one small tile) + an odd tail; the cluster form's ranks share the elements."""
    rng = np.random.default_rng(splits * 31 + ranks)
    elems = 16 * 128 + 37
    parts = (rng.standard_normal((splits, elems)) * rng.choice([1e-3, 1.0, 1e3], (splits, 1))).astype(np.float32)
    cluster_ok = splits <= 8
    out = driver(["splitk", splits, elems, ranks], parts)
    owners = np.array([int(r[0]) for r in out])
    serial, batched, cluster = (np.array([float.fromhex(r[i]) for r in out], dtype=np.float32) for i in (1, 2, 3))
    assert (owners == 1).all()
    np.testing.assert_array_equal(serial, left_to_right(parts))  # split order, bitwise
    np.testing.assert_array_equal(batched, serial)
    if cluster_ok:
        np.testing.assert_array_equal(cluster, serial)
    exact = parts.astype(np.float64).sum(0)
    bound = splits * np.finfo(np.float32).eps * np.abs(parts.astype(np.float64)).sum(0)
    assert (np.abs(serial - exact) <= bound + 1e-30).all()


def split_attention(rng, keys: int, keys_per_split: int, splits: int, rows: int = 5, d: int = 16):
    """Per-split normalised outputs and log2-sum-exps (fp32, as the kernel's workspace holds them) of softmax
    attention over `keys` keys; splits past the keys hold lse -inf and output 0. And the float64 answer."""
    q, k, v = (rng.standard_normal(s) for s in ((rows, d), (keys, d), (keys, d)))
    scores = q @ k.T / np.sqrt(d) * np.log2(np.e)  # log2 domain, as the kernel
    lse = np.full((splits, rows), -np.inf)
    o = np.zeros((splits, rows, d))
    for s in range(splits):
        cols = slice(s * keys_per_split, min((s + 1) * keys_per_split, keys))
        if cols.start >= keys:
            continue
        m = scores[:, cols].max(1, keepdims=True)
        p = np.exp2(scores[:, cols] - m)
        lse[s] = (m[:, 0] + np.log2(p.sum(1)))
        o[s] = p @ v[cols] / p.sum(1, keepdims=True)
    p = np.exp2(scores - scores.max(1, keepdims=True))
    return lse.astype(np.float32), o.astype(np.float32), p @ v / p.sum(1, keepdims=True)


@pytest.mark.parametrize("keys,keys_per_split,splits", [(1000, 128, 8), (300, 128, 17), (64, 128, 6),
                                                        (4096, 64, 64), (129, 128, 2)])
def test_merge_parallel_and_active_splits_equal_serial_and_float64(driver, keys, keys_per_split, splits):
    rng = np.random.default_rng(keys + splits)
    lse, o, exact = split_attention(rng, keys, keys_per_split, splits)
    rows, d = exact.shape
    out = driver(["merge", splits, rows, d, keys, keys_per_split], np.concatenate([lse.ravel(), o.ravel()]))
    active = int(out[0][-1])
    assert active == min(-(-keys // keys_per_split), splits)
    for r in range(rows):
        every, only_active = ([float.fromhex(x) for x in line[:-1]] for line in out[2 * r:2 * r + 2])
        serial_all, par_all = np.array(every[0::2], np.float32), np.array(every[1::2], np.float32)
        serial_act, par_act = np.array(only_active[0::2], np.float32), np.array(only_active[1::2], np.float32)
        np.testing.assert_array_equal(par_all, serial_all)  # same sums in the same order: bitwise
        np.testing.assert_array_equal(par_act, serial_all)  # the empty splits added exact zeros
        np.testing.assert_array_equal(serial_act, serial_all)
        np.testing.assert_allclose(serial_all, exact[r], rtol=2e-5, atol=2e-6)


def test_a_row_without_keys_merges_to_zero(driver):
    splits, rows, d = 4, 2, 8
    lse = np.full((splits, rows), -np.inf, np.float32)
    out = driver(["merge", splits, rows, d, 0, 64], np.concatenate([lse.ravel(), np.zeros(splits * rows * d)]))
    assert all(float.fromhex(x) == 0.0 for line in out for x in line[:-1]) and int(out[0][-1]) == 1
