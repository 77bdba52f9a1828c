"""Capturing a call into a CUDA graph the way torch.cuda.graph asks: warm-up calls on a side stream
first, then the capture."""

import torch


def capture(fn, warmups=2):
    """(graph, what fn returned during the capture); replay the graph to run fn again."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result
