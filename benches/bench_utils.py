"""Helpers of the microbenchmarks: device names for extra_info, GPU timing by CUDA-graph replay."""
import platform

import torch

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def graph_replayer(fn, calls: int):
    """A callable that replays `calls` captured calls of fn() and synchronises (µs-scale GPU timing
    without launch overhead). Falls back to eager calls when fn cannot be captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()  # warm-up: allocator, lazy init
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except RuntimeError:
        def eager():
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        return eager, False

    def replay():
        graph.replay()
        torch.cuda.synchronize()
    return replay, True
