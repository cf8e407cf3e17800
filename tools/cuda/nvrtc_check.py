"""Compiles every CUDA kernel module with NVIDIA's own NVRTC for sm_90, without a GPU (CI runs it).

The CPU emulation (tools/cuda/emu/) compiles the kernel sources as C++ with g++, which accepts code NVRTC may refuse;
a module NVRTC refuses leaves the whole CUDA backend unable to open. This builds each module's text as the binary
does (common.cuh, then its .cu parts; planted-fault blocks are #ifdef'd out), compiles it with the backend's options
(cuda/nvrtc.rs: --fmad=false, --std=c++17) for sm_90 with ptxas's resource report, and prints each kernel's
registers, spills and shared memory. Exits 1 when a module does not compile or a kernel spills registers to local
memory. NVRTC comes from PyPI (tools/cuda/requirements.txt: nvidia-cuda-nvrtc-cu12, pinned).

    python3 tools/cuda/nvrtc_check.py [--arch sm_90]
"""
import argparse
import ctypes
import glob
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "emu"))
import gen  # noqa: E402  (the module list and each module's parts, shared with the emulator)


def nvrtc():
    """The pip package's libnvrtc, or None."""
    for base in sys.path:
        hits = glob.glob(os.path.join(base, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*"))
        hits = [h for h in hits if re.search(r"libnvrtc\.so\.\d+$", h)]
        if hits:
            return ctypes.CDLL(hits[0])
    return None


def compile_module(lib, name, text, arch):
    """(ok, log) of one module's compile."""
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), f"{name}.cu".encode(), 0, None, None) != 0:
        return False, "nvrtcCreateProgram failed"
    opts = [f"--gpu-architecture={arch}", "--fmad=false", "--std=c++17", "--ptxas-options=-v"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc == 0, log.value.decode(errors="replace")


def report(log):
    """Lines `kernel: N registers, S bytes spilled, M bytes shared` from ptxas's report, and whether any spilled."""
    lines, spilled, kernel, spill = [], False, None, 0
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            kernel = m.group(1)
        elif m := re.search(r"(\d+) bytes spill stores", line):
            spill = int(m.group(1))
        elif (m := re.search(r"Used (\d+) registers(.*)", line)) and kernel:
            smem = re.search(r"(\d+) bytes smem", m.group(2))
            lines.append(f"  {kernel}: {m.group(1)} registers, {spill} bytes spilled, "
                         f"{smem.group(1) if smem else 0} bytes static shared")
            spilled |= spill > 0
            kernel, spill = None, 0
    return lines, spilled


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    arch = ap.parse_args().arch
    lib = nvrtc()
    if lib is None:
        print("nvrtc check: no libnvrtc (pip install -r tools/cuda/requirements.txt)")
        return 1
    failed = 0
    for mod in gen.MODULES:
        text = open(gen.SRC + "common.cuh").read() + "\n" + gen.module_text(mod)
        ok, log = compile_module(lib, mod, text, arch)
        lines, spilled = report(log)
        verdict = "ok" if ok and not spilled else "FAIL"
        print(f"{verdict}: {mod} ({len(lines)} kernels, {arch})")
        print("\n".join(lines))
        if not ok:
            print(log[:4000])
        failed += verdict != "ok"
    print(f"nvrtc check: {len(gen.MODULES) - failed} of {len(gen.MODULES)} modules compile for {arch} without spills")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
