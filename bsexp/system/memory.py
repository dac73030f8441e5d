"""Memory: what a process holds, caps on it, and how an out-of-memory error is recognised.

On CPU a real allocator failure is produced safely by capping the process's address space
(RLIMIT_AS) above what it has mapped already: the allocator then raises "DefaultCPUAllocator:
can't allocate memory" instead of the kernel killing the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import resource
from pathlib import Path

import torch

GIB = 2**30
MIB = 2**20
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters (malloc.h)

# Messages of out-of-memory errors that do not arrive as torch.OutOfMemoryError.
OOM_MESSAGES = (
    "CUDA out of memory",
    "HIP out of memory",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
    "DefaultCPUAllocator: can't allocate memory",
    "can't allocate memory",
    "std::bad_alloc",
    # oneDNN, when the memory for a kernel it compiles is refused (seen under a memory cap).
    "could not create a primitive",
)


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error from any device's allocator; False for anything else."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in OOM_MESSAGES)


def error_line(exc: BaseException) -> str:
    """An out-of-memory error in one line (its first, at most 200 characters; its type where it
    has no message, as Python's own MemoryError)."""
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__


def _status(field: str, pid: int | str = "self") -> int:
    """A /proc/<pid>/status field in bytes (Linux); this process's by default."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def vm_size(pid: int | str = "self") -> int:
    """Bytes of address space the process (this one by default) has mapped now (what RLIMIT_AS limits)."""
    return _status("VmSize", pid)


def vm_peak() -> int:
    """The largest address space the process has had mapped (VmPeak; it cannot be reset)."""
    return _status("VmPeak")


def address_space_room(mapped: int) -> int | None:
    """Bytes the address-space cap leaves beyond `mapped`; None when there is no cap."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft - mapped


def rss() -> int:
    """Bytes resident now."""
    return _status("VmRSS")


def held() -> int:
    """Bytes the process holds itself: anonymous and shared-memory pages resident, not the
    file-backed pages of its libraries (page cache, whose residency differs between processes)."""
    return _status("RssAnon") + _status("RssShmem")


def reset_peak_rss() -> None:
    """Restart the peak resident-set counter (VmHWM), so a trial's own peak can be read."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def peak_rss() -> int:
    return _status("VmHWM")


def total_memory() -> int:
    """Bytes of memory the machine has (MemTotal)."""
    with open("/proc/meminfo") as meminfo:
        return int(meminfo.readline().split()[1]) * 1024


def available_memory() -> int:
    """Bytes the machine can still give (MemAvailable)."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise KeyError("MemAvailable")


def cap_memory(limit_bytes: int) -> int:
    """Cap this process at about `limit_bytes` of memory in all: the address space may grow by
    what the process does not hold yet (limit - `held()`) beyond what is mapped now. Returns the
    bytes left. The file-backed pages of torch's libraries (~300 MB) are not counted: they are
    page cache the kernel can drop, and how many are resident differs from process to process
    (300-311 MB in five runs of one command), which moved every cap and every finder answer.

    Lowers only the soft limit, so it can be lifted again with `lift_memory_cap`."""
    room = limit_bytes - held()
    if room <= 0:
        raise CapBelowUse(held(), limit_bytes)
    return cap_room(room)


def cap_room(room_bytes: int) -> int:
    """Let the address space grow by `room_bytes` beyond what is mapped now, and no further.
    torch's CPU threads are started first (as many as it is set to), so that their stacks (8 MiB
    each) are mapped already, not taken from the room: started under a cap without room for them,
    libgomp ends the process ("Thread creation failed") and torch 2.11's set_num_threads waits for
    them forever (seen at 16 threads)."""
    torch.ones(2**20).sum()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + room_bytes, hard))
    return room_bytes


class CapBelowUse(ValueError):
    """A memory cap below what the process holds already."""

    def __init__(self, held: int, limit: int) -> None:
        super().__init__(
            f"{limit / GIB:.2f} GB is less than the {held / GIB:.2f} GB the process holds already "
            f"(torch, the model and the data)"
        )
        self.held, self.limit = held, limit


def lift_memory_cap() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c"))


def trim_freed_memory() -> None:
    """Give memory that is free but still held by glibc back to the system (malloc_trim)."""
    _libc().malloc_trim(0)


def return_freed_memory() -> None:
    """Make glibc hand every freed block of 128 KiB or more back to the system at once (a fixed
    mmap threshold instead of its self-raising one). Then the resident and mapped sizes follow
    the memory in use, so a trial's peak can be read, and a cap limits live memory, not the
    allocator's cache of freed blocks or per-thread reserves. Used wherever a process is capped:
    the finder's probe process and `trainer.memory_limit_gb`."""
    libc = _libc()
    libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)
    one_arena()
    libc.malloc_trim(0)  # and give back what is free already


def one_arena() -> None:
    """From now on, threads that allocate share glibc's main arena instead of each taking one of
    their own. An arena of a thread's own reserves 64 MiB of address space, and when the cap
    refuses an allocation glibc retries it in another arena, inside that reserve: a capped
    process could hold up to 64 MiB more than its cap for every such arena (a 1.2 GB run held
    1.25 GB). Arenas taken already stay, so this runs before the threads that would take them:
    where a run is to be capped (`bsexp.train.job`), and in the probe server's environment."""
    _libc().mallopt(M_ARENA_MAX, 1)


def release(device: torch.device) -> None:
    """Hand freed memory back before the next attempt: collect garbage, empty the CUDA cache."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def free_blas_buffers() -> bool:
    """Free the buffers MKL keeps from its matrix products for the next ones (its "fast memory
    manager": a few MB, sized by the products run so far, kept until freed). A process that
    trains at one batch size holds those of that size; one that has run other sizes first holds
    theirs as well unless they are freed (the bench's MLP at 0.8 GB: 4.7 MB from a step of 2
    samples and 5.7 MB more from one of 512, where a process that trained at 3,081 alone held
    6.4 MB: ~100 samples of the finder's edge). False where there is no MKL to ask (torch built
    without it, or with a library that does not export the call)."""
    free = _mkl_free_buffers()
    if free is None:
        return False
    free()
    return True


@functools.cache
def _mkl_free_buffers():
    # MKL is linked into libtorch_cpu, which exports its service functions (not the public
    # mkl_free_buffers). RTLD_NOLOAD: the copy torch loaded, never a second one (hundreds of MB
    # of address space, in a process under a cap).
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    if not torch.backends.mkl.is_available() or not library.exists():
        return None
    try:
        return ctypes.CDLL(str(library), mode=os.RTLD_NOLOAD | os.RTLD_LAZY).mkl_serv_free_buffers
    except (OSError, AttributeError):
        return None
