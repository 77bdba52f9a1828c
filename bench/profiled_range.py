"""The profiled range of the profile stages (scripts/gpu-check.sh profile-local, profile-paged):
each named call once between cudaProfilerStart and cudaProfilerStop, under an NVTX range of its
name, so that `ncu --profile-from-start off` sees those calls' kernels and nothing else."""


def profile_calls(calls):
    """Runs calls ({name: callable}) in order inside the profiled range, the GPU idle before and
    after it."""
    import torch
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, call in calls.items():
        torch.cuda.nvtx.range_push(name)
        call()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
