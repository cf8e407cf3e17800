"""Builds the emulated kernels (tools/cuda/emu/run.sh): one shared object per (module, planted fault define) from
the kernel sources the binary embeds, compiled as C++ against emu.h, with a launcher and an arity per kernel."""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "../../../crates/tensorfold-kernels/src/cuda/")
MODULES = ["rows", "dense", "rope", "attention", "conv", "moe", "sample"]
# Files a module's text holds after common.cuh (cuda/device.rs's `Src::body`): the tensor-core linears share dense's,
# the tiled and tensor-core attention attention's.
PARTS = {"dense": ["dense", "dense_tc", "dense_tcw"], "attention": ["attention", "attention_tiled", "attention_mma"]}


def module_text(mod):
    return "\n".join(open(SRC + f + ".cu").read() for f in PARTS.get(mod, [mod]))
ENTRY = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(')


def unit(mod, define, out):
    """Writes and compiles one variant; returns (tag, kernels) or raises with the compiler's message."""
    text = open(SRC + "common.cuh").read() + "\n" + module_text(mod)
    flags = ["-D" + define] if define else []
    pre = subprocess.run(["cpp", "-P"] + flags, input=text, capture_output=True, text=True, check=True).stdout
    names = ENTRY.findall(pre)
    body = text.replace('extern "C" ', "")
    body = re.sub(r"extern __shared__ float (\w+)\[\];", r"float* \1 = (float*)emu::g_dyn.data();", body)
    tu = '#include "%s/emu.h"\n%s\n' % (HERE, body)
    api = 'extern "C" __attribute__((visibility("default")))'
    for n in names:
        tu += (f"{api} void tfemu_launch_{n}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, "
               f"unsigned bz, unsigned smem, void** p) {{ emu::launch(&{n}, gx, gy, gz, bx, by, bz, smem, p); }}\n"
               f"{api} int tfemu_arity_{n}() {{ return emu::arity(&{n}); }}\n")
    tag = mod + "-" + (define or "none")
    open(f"{out}/{tag}.cpp", "w").write(tu)
    cmd = ["g++", "-std=c++17", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fvisibility=hidden", "-w",
           f"{out}/{tag}.cpp", "-o", f"{out}/{tag}.so"] + flags
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{tag}: {r.stderr[:3000]}")
    return tag, len(names)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    jobs = []
    for mod in MODULES:
        text = open(SRC + "common.cuh").read() + module_text(mod)
        jobs += [(mod, d, out) for d in [None] + sorted(set(re.findall(r"\bFAULT_[A-Z0-9_]+", text)))]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for tag, n in pool.map(lambda j: unit(*j), jobs):
            print(tag, n, "kernels")


if __name__ == "__main__":
    main()
