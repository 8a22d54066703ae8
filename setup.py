"""Builds flashmap_ext._C, the op library.

C++ CPU kernels are always built. CUDA kernels (csrc/**/*.cu plus their *_cuda.cpp glue) are built when
torch is a CUDA build and a CUDA toolkit is found; FLASHMAP_CUDA=1 forces them (and fails loudly if that
is impossible), FLASHMAP_CUDA=0 turns them off. Architecture: TORCH_CUDA_ARCH_LIST, default 9.0a (H100/H200).
CUTLASS headers: $CUTLASS_DIR/include, else third_party/cutlass/include (`make cutlass`), else
third_party/cutlass-min/include (`make cutlass-min`: only the headers the kernels include).
DEBUG=1 builds with -O0 -g. FLASHMAP_SKIP_EXT=1 installs without compiling (`make` uses it for the editable
install, then compiles once with `setup.py build_ext --inplace`, which keeps its objects for incremental rebuilds).
"""
import glob
import os

import torch
from setuptools import setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _want_cuda() -> bool:
    flag = os.environ.get("FLASHMAP_CUDA")
    if flag == "0":
        return False
    have = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if flag == "1" and not have:
        raise RuntimeError("FLASHMAP_CUDA=1 but torch is not a CUDA build or no CUDA toolkit was found "
                           "(set CUDA_HOME to the toolkit root, the folder whose bin/ holds nvcc)")
    return have


def _cutlass_include() -> list[str]:
    # The full copy (`make cutlass`), else the trimmed one carried to a GPU machine (`make cutlass-min`).
    candidates = (os.environ.get("CUTLASS_DIR"), os.path.join(ROOT, "third_party", "cutlass"),
                  os.path.join(ROOT, "third_party", "cutlass-min"))
    for base in candidates:
        if base and os.path.isdir(os.path.join(base, "include", "cute")):
            return [os.path.join(base, "include")]
    return []


def _sources(with_cuda: bool) -> list[str]:
    rel = lambda p: os.path.relpath(p, ROOT)
    cpp = sorted(glob.glob(os.path.join(ROOT, "csrc", "**", "*.cpp"), recursive=True))
    cuda_glue = [p for p in cpp if p.endswith("_cuda.cpp")]
    srcs = [p for p in cpp if p not in cuda_glue]
    if with_cuda:
        srcs += cuda_glue + sorted(glob.glob(os.path.join(ROOT, "csrc", "**", "*.cu"), recursive=True))
    return [rel(p) for p in srcs]


def _extension():
    with_cuda = _want_cuda()
    debug = os.environ.get("DEBUG") == "1"
    opt = ["-O0", "-g"] if debug else ["-O3", "-g0"]
    cxx = opt + ["-std=c++20", "-fopenmp"]
    include_dirs = [os.path.join(ROOT, "csrc")]
    kwargs = dict(name="flashmap_ext._C", sources=_sources(with_cuda), include_dirs=include_dirs,
                  extra_link_args=["-fopenmp"])
    if not with_cuda:
        return cpp_extension.CppExtension(extra_compile_args={"cxx": cxx}, **kwargs)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    cutlass = _cutlass_include()
    if not cutlass:  # else nvcc stops on a missing <cute/...> header deep inside the build log
        raise RuntimeError("building the CUDA kernels needs the CUTLASS headers: run `make cutlass` (or set "
                           "CUTLASS_DIR to a CUTLASS checkout, the folder holding include/cute), or set "
                           "FLASHMAP_CUDA=0 for a CPU-only build")
    include_dirs += cutlass
    nvcc_opt = ["-O0", "-g"] if debug else ["-O3"]  # nvcc has no -g0 (it is the default there)
    nvcc = nvcc_opt + ["-std=c++20", "--expt-relaxed-constexpr", "--expt-extended-lambda", "-lineinfo"]
    return cpp_extension.CUDAExtension(extra_compile_args={"cxx": cxx + ["-DFLASHMAP_WITH_CUDA"],
                                                           "nvcc": nvcc + ["-DFLASHMAP_WITH_CUDA"]},
                                       **kwargs)


setup(ext_modules=[] if os.environ.get("FLASHMAP_SKIP_EXT") == "1" else [_extension()],
      cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)})
