"""The CUDA kernels on a machine without a GPU: every source compiles for sm_90 with no warnings and
no register spills (nvcc -cubin -Xptxas -v), fits an H100/H200 block's shared memory, and
ag.attention.gpu imports, refuses bad calls with clear errors and says why it cannot run.

``pytest -s`` prints each kernel's registers, spills and shared memory. Without nvcc these tests
skip, unless AG_REQUIRE_NVCC=1 (CI), when they fail.
"""
import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from ag.attention import gpu
from ag.ops import ShapeError

ARCH = "sm_90"
HEAD_DIMS = (16, 17, 64, 80, 128)  # the GPU tests' head dims, and 17 for the loads that are not vectors
MAX_SMEM_PER_BLOCK = 232448    # sm_90: 227 KB of shared memory per block, opting in


def ptxas_report(log: str) -> dict[str, dict[str, int]]:
    """{entry point: {registers, spill_stores, spill_loads, stack, static_smem}} from a ptxas -v log."""
    found, name = {}, None
    for line in log.splitlines():
        if m := re.search(r"Function properties for (\w+)", line):
            name = m.group(1)
            found[name] = {"static_smem": 0}
        elif name and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                      line)):
            found[name].update(stack=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
        elif name and (m := re.search(r"Used (\d+) registers", line)):
            found[name]["registers"] = int(m[1])
            if s := re.search(r"(\d+) bytes smem", line):
                found[name]["static_smem"] = int(s[1])
    return found


@dataclass(frozen=True)
class Compiled:
    """One ``nvcc -cubin`` of one source at one head dim."""

    source: str
    d: int
    returncode: int
    log: str
    ptx: str
    seconds: float

    def kernels(self) -> dict[str, dict[str, int]]:
        return ptxas_report(self.log)

    def dynamic_smem(self, kernel: str) -> int:
        """The ``<kernel>_smem`` constant the loader reads, from the PTX (0 when the kernel has none)."""
        m = re.search(rf"\.const .*\b{kernel}_smem = (\d+);", self.ptx)
        return int(m[1]) if m else 0


def nvcc() -> str:
    found = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")
    if found is None:
        message = "nvcc not found: the CUDA kernels are not compile-checked here (CI sets AG_REQUIRE_NVCC=1)"
        if os.environ.get("AG_REQUIRE_NVCC") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


def compile_source(compiler: str, source: str, d: int, workdir: Path) -> Compiled:
    out = workdir / f"{source}_{d}"
    out.mkdir()
    code = out / f"{source}.cu"  # the code NVRTC gets, shared header pasted in: compiled in a folder without it
    code.write_text(gpu.kernel_code(source))
    command = [compiler, "-cubin", f"-arch={ARCH}", "-Xptxas", "-v", "-std=c++17", f"-DHEAD_DIM={d}",
               "--Werror", "all-warnings", "--keep", "--keep-dir", str(out), "-o", str(out / "kernel.cubin"),
               str(code)]
    start = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    ptx = "".join(p.read_text() for p in out.glob("*.ptx"))
    return Compiled(source, d, run.returncode, run.stdout + run.stderr, ptx, seconds)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[tuple[str, int], Compiled]:
    compiler = nvcc()
    workdir = tmp_path_factory.mktemp("cubins")
    jobs = [(source, d) for source in gpu.kernel_sources() for d in HEAD_DIMS]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(lambda job: compile_source(compiler, *job, workdir), jobs))
    print_table(results, time.perf_counter() - start)
    return {(r.source, r.d): r for r in results}


def print_table(results: list[Compiled], seconds: float) -> None:
    print(f"\n\nptxas -v for {ARCH}, {len(results)} compiles in {seconds:.1f} s wall "
          f"({sum(r.seconds for r in results):.1f} s of nvcc) on {os.cpu_count()} CPUs\n")
    print(f"{'kernel':<26}{'d':>4}{'registers':>10}{'spill st':>9}{'spill ld':>9}{'stack':>6}{'smem (B)':>10}")
    for r in results:
        for name, k in r.kernels().items():
            smem = k["static_smem"] + r.dynamic_smem(name)
            print(f"{name:<26}{r.d:>4}{k.get('registers', 0):>10}{k.get('spill_stores', 0):>9}"
                  f"{k.get('spill_loads', 0):>9}{k.get('stack', 0):>6}{smem:>10}")


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("source", list(gpu.KERNELS))
def test_every_kernel_source_compiles_for_sm90_without_warnings(compiled, source, d):
    result = compiled[(source, d)]
    assert result.returncode == 0, f"nvcc failed on {source}.cu with HEAD_DIM={d}:\n{result.log}"


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("source", list(gpu.KERNELS))
def test_the_cubin_has_every_entry_point_the_loader_calls(compiled, source, d):
    assert set(compiled[(source, d)].kernels()) == set(gpu.KERNELS[source])


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("source", list(gpu.KERNELS))
def test_no_kernel_spills_registers_to_local_memory(compiled, source, d):
    for name, k in compiled[(source, d)].kernels().items():
        assert k["spill_stores"] == 0 and k["spill_loads"] == 0, \
            f"{name} (d = {d}) spills: {k['spill_stores']} bytes stored, {k['spill_loads']} loaded"


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("source", list(gpu.KERNELS))
def test_shared_memory_of_every_block_fits_an_sm90_block(compiled, source, d):
    result = compiled[(source, d)]
    for name, k in result.kernels().items():
        smem = k["static_smem"] + result.dynamic_smem(name)
        assert 0 < smem <= MAX_SMEM_PER_BLOCK or name == "flash_bwd_preprocess_f32", \
            f"{name} (d = {d}) needs {smem} bytes of shared memory per block, sm_90 has {MAX_SMEM_PER_BLOCK}"


# ---- NVRTC, the compiler cupy.RawModule uses at run time (no host headers) ----

def nvrtc_library() -> ctypes.CDLL:
    """libnvrtc from the nvidia-cuda-nvrtc wheel (a CuPy dependency) or the system; skip without one."""
    candidates = []
    try:
        import nvidia.cuda_nvrtc
        candidates += [str(p) for d in nvidia.cuda_nvrtc.__path__ for p in sorted(Path(d, "lib").glob("libnvrtc.so*"))]
    except ImportError:
        pass
    candidates += [name for name in (ctypes.util.find_library("nvrtc"),) if name]
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12): the NVRTC compile is not checked here")


def nvrtc_compile(nvrtc: ctypes.CDLL, source: Path, d: int) -> tuple[int, str]:
    """(status, log) of compiling ``source`` for sm_90 the way ag.attention.gpu has CuPy do it."""
    program = ctypes.c_void_p()
    code, name = gpu.kernel_code(source.stem).encode(), source.name.encode()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(program), code, name, 0, None, None) == 0
    options = [b"-std=c++17", f"-DHEAD_DIM={d}".encode(), f"--gpu-architecture={ARCH}".encode(), b"-Xptxas=-v"]
    status = nvrtc.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    return status, log.value.decode(errors="replace")


@pytest.mark.parametrize("d", [17, 128])
@pytest.mark.parametrize("source", list(gpu.KERNELS))
def test_every_kernel_source_compiles_with_nvrtc_as_cupy_loads_it_without_spills(source, d):
    status, log = nvrtc_compile(nvrtc_library(), gpu.kernel_sources()[source], d)
    assert status == 0, f"NVRTC failed on {source}.cu with HEAD_DIM={d}:\n{log}"
    kernels = ptxas_report(log)
    assert set(kernels) == set(gpu.KERNELS[source])
    for name, k in kernels.items():
        print(f"NVRTC {name} d={d}: {k['registers']} registers, {k['spill_stores']} bytes of spill stores")
        assert k["spill_stores"] == 0 and k["spill_loads"] == 0, f"{name} (d = {d}) spills under NVRTC"


def test_the_loader_lists_the_four_kernel_sources_and_they_exist():
    sources = gpu.kernel_sources()
    assert list(sources) == ["flash_fwd", "flash_bwd", "flash_fwd_bf16", "flash_bwd_bf16"]
    assert all(path.is_file() and path.suffix == ".cu" for path in sources.values())


def test_the_bf16_sources_get_their_shared_header_pasted_in_for_nvrtc():
    header = (gpu.KERNEL_DIR / "bf16_mma.cuh").read_text()
    for source in ("flash_fwd_bf16", "flash_bwd_bf16"):
        text, code = gpu.kernel_sources()[source].read_text(), gpu.kernel_code(source)
        assert '#include "bf16_mma.cuh"' in text and not re.search(r"^#include", code, re.MULTILINE)
        assert header in code and len(code) == len(text) - len('#include "bf16_mma.cuh"') + len(header)


def test_a_bad_do_for_the_bf16_backward_is_refused_naming_it():
    q, k, v = qkv((1, 2, 8, 16), (1, 2, 8, 16))
    with pytest.raises(ShapeError, match=r"backward needs do of shape \(1, 2, 8, 16\), float32 or uint16, got "
                                         r"\(1, 2, 8, 16\), float64"):
        gpu.backward_bf16(q, k, v, q, np.zeros((1, 2, 8), np.float32), q.astype(np.float64))


# ---- ag.attention.gpu with no GPU ----

def test_the_module_imports_without_cupy_and_available_says_why():
    code = textwrap.dedent("""
        import sys
        sys.modules["cupy"] = None  # an import of cupy now raises ImportError
        import ag, ag.attention.gpu as m
        ok, reason = m.available()
        assert ok is False and "CuPy" in reason, reason
        print(reason)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr
    assert "not importable" in run.stdout


def test_available_gives_a_flag_and_a_reason():
    ok, reason = gpu.available()
    assert isinstance(ok, bool) and isinstance(reason, str) and reason


def qkv(q_shape, kv_shape, dtype=np.float32):
    return np.zeros(q_shape, dtype), np.zeros(kv_shape, dtype), np.zeros(kv_shape, dtype)


def test_head_dims_over_128_are_refused_with_the_shape():
    with pytest.raises(ValueError, match=r"flash_attention.*1\.\.128, got d = 256 .*\(2, 4, 8, 256\)"):
        gpu.forward(*qkv((2, 4, 8, 256), (2, 4, 8, 256)))


def test_float64_inputs_to_the_float32_kernels_are_refused():
    with pytest.raises(TypeError, match=r"flash_attention.*float32, got float64, float64, float64"):
        gpu.forward(*qkv((1, 2, 8, 16), (1, 2, 8, 16), np.float64))


def test_query_heads_must_be_a_multiple_of_key_value_heads():
    with pytest.raises(ShapeError, match="3 query heads are not a multiple of 2"):
        gpu.backward(*qkv((1, 3, 8, 16), (1, 2, 8, 16)), None, None, None)


def test_an_unknown_causal_mode_is_refused():
    with pytest.raises(ValueError, match="causal must be False, True"):
        gpu.forward_bf16(*qkv((1, 2, 8, 16), (1, 2, 8, 16)), causal="top_right")


def test_numpy_arrays_are_refused_with_a_type_error_naming_them():
    with pytest.raises(TypeError, match="need CuPy arrays, got numpy.ndarray"):
        gpu.forward(*qkv((1, 2, 8, 16), (1, 2, 8, 16)))


def test_bfloat16_rounding_is_to_nearest_even_and_round_trips():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, 3.4e38, 0.0], np.float32)
    bits = gpu.to_bfloat16(x)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(gpu.from_bfloat16(bits),
                                  np.array([1.0, 1.0, 1 + 4 * 2**-8, -2.5, np.inf, 0.0], np.float32))
